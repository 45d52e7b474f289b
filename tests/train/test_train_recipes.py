"""Setup recipes: schedules, channels_last, compile fallback, optimizers, prefetch, metrics, samplers."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from pitstop.train import (
    DevicePrefetcher,
    RunningMean,
    TrainConfig,
    batch_size,
    channels_last_input,
    cyclic,
    distributed_sampler,
    fit,
    has_conv2d,
    make_optimizer,
    maybe_compile,
    one_cycle,
    set_epoch,
    to_channels_last,
    total_steps,
    unwrap,
)
from pitstop.train.distributed import DistEnv, env_from_environ


def test_total_steps_counts_optimizer_steps() -> None:
    assert total_steps(10, epochs=3, accum_steps=4) == 9  # ceil(10/4) = 3 per epoch
    assert total_steps(list(range(8)), epochs=2) == 16
    with pytest.raises(ValueError):
        total_steps(0, 1)


def test_onecycle_in_fit_completes_exactly_its_cycle() -> None:
    x, y = torch.randn(30, 4), torch.randint(0, 2, (30,))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=4)  # 8 batches
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    cfg = TrainConfig(
        epochs=2,
        accum_steps=3,
        schedule="onecycle",
        max_lr=0.5,
        precision="fp32",
        progress=False,
        log_every=1,
    )
    res = fit(model, opt, loader, torch.nn.functional.cross_entropy, cfg)
    assert res.steps == 6  # ceil(8/3) * 2
    lrs = [row["lr"] for row in res.history]
    assert max(lrs) == pytest.approx(0.5, rel=0.05)
    assert lrs[-1] < 0.5 / 1000  # annealed to the end of the cycle, not stuck mid-way


def test_cyclic_spans_half_an_epoch_up() -> None:
    opt = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)
    sched = cyclic(opt, 0.01, 0.1, loader=20, accum_steps=2)  # 10 steps/epoch: 5 up, 5 down
    lrs = []
    for _ in range(10):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs[5] == pytest.approx(0.1) and lrs[0] == pytest.approx(0.01)
    assert not sched.cycle_momentum  # SGD without momentum: left alone
    opt2 = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)
    assert one_cycle(opt2, 0.1, loader=10, epochs=1).total_steps == 10


def test_channels_last_model_and_inputs() -> None:
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Flatten())
    assert has_conv2d(net) and not has_conv2d(torch.nn.Linear(2, 2))
    to_channels_last(net)
    assert net[0].weight.is_contiguous(memory_format=torch.channels_last)
    x, y = torch.randn(2, 3, 8, 8), torch.tensor([0, 1])
    bx, by = channels_last_input((x, y))
    assert bx.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous(
        memory_format=torch.channels_last
    )
    assert by is y
    d = channels_last_input({"img": x, "n": 3})
    assert d["img"].is_contiguous(memory_format=torch.channels_last) and d["n"] == 3


def test_fit_channels_last_auto_is_on_for_conv_nets_and_can_be_forced_off() -> None:
    x, y = torch.randn(8, 3, 6, 6), torch.randint(0, 2, (8,))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=4)

    def net() -> torch.nn.Module:
        return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Flatten(), torch.nn.Linear(64, 2))

    auto = net()
    res = fit(auto, None, loader, torch.nn.functional.cross_entropy, TrainConfig(progress=False))
    assert res.applied["channels_last"] is True
    assert auto[0].weight.is_contiguous(memory_format=torch.channels_last)
    assert res.applied["optimizer"] == "AdamW fused"
    off = net()
    res = fit(
        off,
        None,
        loader,
        torch.nn.functional.cross_entropy,
        TrainConfig(channels_last=False, progress=False),
    )
    assert res.applied["channels_last"] is False
    assert not off[0].weight.is_contiguous(memory_format=torch.channels_last)
    mlp = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(108, 2))
    res = fit(mlp, None, loader, torch.nn.functional.cross_entropy, TrainConfig(progress=False))
    assert res.applied["channels_last"] is False  # no convolutions: nothing to gain


def _failing_backend(gm: torch.fx.GraphModule, example_inputs: list) -> object:
    raise RuntimeError("backend exploded")


def test_compile_falls_back_to_eager_with_a_warning() -> None:
    model = torch.nn.Linear(3, 2)
    wrapped = maybe_compile(model, backend=_failing_backend)
    x = torch.randn(4, 3)
    with pytest.warns(RuntimeWarning, match="torch.compile failed"):
        out = wrapped(x)
    torch.testing.assert_close(out, model(x))
    assert wrapped.failed is not None and unwrap(wrapped) is model
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once only
        wrapped(x)
    assert maybe_compile(model, enabled=False) is model


def test_make_optimizer_fused_and_no_decay_groups() -> None:
    net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    opt = make_optimizer(net, "adamw", lr=0.01, weight_decay=0.1)
    decay, no_decay = opt.param_groups
    assert [p.dim() for p in decay["params"]] == [2] and decay["weight_decay"] == 0.1
    assert len(no_decay["params"]) == 3 and no_decay["weight_decay"] == 0.0
    assert opt.defaults["fused"] is True  # CPU fused AdamW exists in this torch
    assert len(make_optimizer(net, "adamw", lr=0.01).param_groups) == 1  # no decay: one kernel launch
    sgd = make_optimizer(net.parameters(), "sgd", lr=0.1, fused=False, momentum=0.9)
    assert sgd.defaults["foreach"] is True
    with pytest.raises(ValueError, match="optimizer"):
        make_optimizer(net, "lion")


def test_fused_adamw_matches_reference_adamw() -> None:
    torch.manual_seed(0)
    a, b = torch.nn.Linear(5, 3), torch.nn.Linear(5, 3)
    b.load_state_dict(a.state_dict())
    oa = make_optimizer(a, lr=0.01, weight_decay=0.1)
    ob = torch.optim.AdamW(
        [{"params": [b.weight], "weight_decay": 0.1}, {"params": [b.bias], "weight_decay": 0.0}],
        lr=0.01,
        foreach=False,
    )
    for _ in range(3):
        x = torch.randn(8, 5)
        for m, o in ((a, oa), (b, ob)):
            m(x).square().mean().backward()
            o.step()
            o.zero_grad()
    torch.testing.assert_close(a.weight, b.weight, rtol=1e-5, atol=1e-6)


def test_prefetcher_on_cpu_passes_batches_through_and_converts_format() -> None:
    x = torch.randn(4, 3, 5, 5)
    data = [(x, torch.arange(4))] * 3
    pf = DevicePrefetcher(data, "cpu", channels_last=True)
    assert len(pf) == 3
    out = list(pf)
    assert len(out) == 3 and torch.equal(out[0][0], x)
    assert out[0][0].is_contiguous(memory_format=torch.channels_last)


def test_set_epoch_reaches_distributed_sampler_through_prefetcher() -> None:
    ds = torch.utils.data.TensorDataset(torch.arange(10))
    env = DistEnv(rank=1, world_size=2)
    sampler = distributed_sampler(ds, env, shuffle=True, seed=3)
    assert sampler is not None and distributed_sampler(ds, DistEnv()) is None
    loader = torch.utils.data.DataLoader(ds, sampler=sampler, batch_size=5)
    assert set_epoch(DevicePrefetcher(loader, "cpu"), 4)
    assert sampler.epoch == 4
    assert len(list(sampler)) == 5  # each of 2 ranks gets half
    assert not set_epoch(torch.utils.data.DataLoader(ds), 1)
    assert env_from_environ({"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4"}) == (3, 1, 4)
    assert env_from_environ({}) == (0, 0, 1)


def test_running_mean_is_sample_weighted_and_resets() -> None:
    m = RunningMean()
    m.update(torch.tensor(1.0), 2)
    m.update(torch.tensor(4.0), 1)
    assert m.read() == pytest.approx(2.0)
    assert m.count == 0
    assert batch_size((torch.zeros(7, 2), torch.zeros(7))) == 7
    assert batch_size({"ids": torch.zeros(3, 5)}) == 3


def test_fit_max_steps_and_compute_loss_and_eval() -> None:
    x, y = torch.randn(32, 4), torch.randint(0, 2, (32,))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=4)
    model = torch.nn.Linear(4, 2)
    calls = []

    def compute(m: torch.nn.Module, batch: tuple) -> torch.Tensor:
        calls.append(1)
        return torch.nn.functional.cross_entropy(m(batch[0]), batch[1])

    res = fit(
        model,
        None,
        loader,
        config=TrainConfig(epochs=3, max_steps=5, progress=False),
        compute_loss=compute,
        val_loader=loader,
    )
    assert res.steps == 5 and res.epochs_completed == 0
    assert res.val and "loss" in res.val[0]
    with pytest.raises(TypeError, match="loss_fn"):
        fit(torch.nn.Linear(4, 2), None, loader, config=TrainConfig(progress=False))


def test_unwrap_removes_only_known_wrappers() -> None:
    class Holder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.module = torch.nn.Linear(2, 2)  # a user's attribute that happens to be called module

    h = Holder()
    assert unwrap(h) is h
    assert unwrap(maybe_compile(h)) is h
    assert unwrap(torch.nn.DataParallel(h)) is h


def test_onecycle_is_sized_to_max_steps_when_training_stops_early() -> None:
    x, y = torch.randn(40, 4), torch.randint(0, 2, (40,))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=4)
    cfg = TrainConfig(epochs=5, max_steps=7, schedule="onecycle", max_lr=0.1, progress=False, log_every=1)
    res = fit(torch.nn.Linear(4, 2), None, loader, torch.nn.functional.cross_entropy, cfg)
    assert res.steps == 7
    assert res.history[-1]["lr"] < 0.1 / 1000  # the last step used the cycle's final LR


def test_progress_shows_loss_lr_and_throughput() -> None:
    import io

    from rich.console import Console

    from pitstop.train import TrainProgress

    buf = io.StringIO()
    with TrainProgress(4, console=Console(file=buf, width=120, force_terminal=False)) as prog:
        prog.advance(2, samples=64)
        rate = prog.log(0.5, 1e-3)
    assert rate > 0
    out = buf.getvalue()
    assert "loss 0.5000" in out and "samples/s" in out and "2/4" in out, out
    silent = TrainProgress(4, enabled=False)
    with silent:
        silent.advance(1, 8)
        assert silent.log(1.0, 0.1) > 0


def test_init_distributed_outside_torchrun_is_single_process(monkeypatch: pytest.MonkeyPatch) -> None:
    from pitstop.train import init_distributed

    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(k, raising=False)
    env = init_distributed("cpu")
    assert (env.rank, env.world_size, env.is_distributed, env.is_main) == (0, 1, False, True)
    assert env.device == torch.device("cpu")


def test_ctrl_c_returns_what_was_measured_and_keeps_the_last_checkpoint(tmp_path: object) -> None:
    from pathlib import Path

    from pitstop.train import load_checkpoint

    x, y = torch.randn(32, 4), torch.randint(0, 2, (32,))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=4)
    calls = []

    def compute(m: torch.nn.Module, batch: tuple) -> torch.Tensor:
        calls.append(1)
        if len(calls) == 4:
            raise KeyboardInterrupt
        return torch.nn.functional.cross_entropy(m(batch[0]), batch[1])

    path = Path(str(tmp_path)) / "c.pt"
    cfg = TrainConfig(progress=False, log_every=1, checkpoint_path=str(path), checkpoint_every=2)
    res = fit(torch.nn.Linear(4, 2), None, loader, config=cfg, compute_loss=compute)
    assert res.interrupted and res.steps == 3 and len(res.history) == 3
    assert load_checkpoint(path, torch.nn.Linear(4, 2)).step == 2  # not overwritten mid-step


def test_fit_applies_activation_checkpointing_and_clipping() -> None:
    x, y = torch.randn(16, 4), torch.randint(0, 2, (16,))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=4)
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU()), torch.nn.Linear(8, 2)
    )
    cfg = TrainConfig(activation_checkpointing=["0"], clip_grad_norm=0.5, progress=False, precision="bf16")
    res = fit(model, None, loader, torch.nn.functional.cross_entropy, cfg)
    assert res.applied["activation_checkpointing"] == ["0"] and res.applied["precision"] == "bf16"
    assert res.steps == 4 and math.isfinite(res.final_loss)
