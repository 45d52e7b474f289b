"""The in-process instrumentation: step boundaries, stopping, syncs, loaders, overrides, undo."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from pitstop.profile.capture.facts import finish_optimizer_facts
from pitstop.profile.capture.hooks import Config, Instrumentation, StopProfiling
from pitstop.profile.record.overrides import Overrides

torch.set_num_threads(1)


@pytest.fixture
def instrument():
    made: list[Instrumentation] = []

    def make(**kw) -> Instrumentation:
        inst = Instrumentation(Config(**kw))
        inst.install()
        made.append(inst)
        return inst

    yield make
    for inst in made:
        inst.uninstall()


def _data(n=64, batch=8, **loader_kw):
    ds = TensorDataset(torch.randn(n, 4), torch.randint(0, 2, (n,)))
    return DataLoader(ds, batch_size=batch, **loader_kw)  # LOADER-LINE


def _train(loader, epochs=1, item_every_step=False, two_optimizers=False):
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    opt = torch.optim.SGD(model[0].parameters(), lr=0.1)
    opt2 = torch.optim.SGD(model[2].parameters(), lr=0.1) if two_optimizers else None
    sched = torch.optim.lr_scheduler.StepLR(opt, 1)
    seen = []
    for _ in range(epochs):
        for x, y in loader:
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if opt2 is not None:
                opt2.step()
            sched.step()
            if item_every_step:
                seen.append(loss.item())  # SYNC-LINE
    return model, opt, seen


def test_one_step_per_iteration_with_two_optimizers_and_a_scheduler(instrument):
    inst = instrument(warmup=1, steps=100, full=True)
    _train(_data(n=64, batch=8), two_optimizers=True)
    inst.close_pending()
    assert len(inst.records) == 8  # 64 samples / 8 per batch, whatever the optimizers do
    assert all(r["optimizer_s"] > 0 and r["forward_s"] > 0 and r["backward_s"] > 0 for r in inst.records)
    assert [r["warmup"] for r in inst.records[:2]] == [True, False]
    assert len(inst.captured.models) == 1 and len(inst.captured.optimizers) == 2


def test_stops_after_the_measured_steps_and_not_swallowed_by_except_exception(instrument):
    inst = instrument(warmup=2, steps=3)
    with pytest.raises(StopProfiling):
        try:
            _train(_data(n=400, batch=4))
        except Exception:  # a script's catch-all must not swallow the stop
            pytest.fail("StopProfiling was caught by `except Exception`")
    assert len(inst.records) == 5
    assert sum(not r["warmup"] for r in inst.records) == 3


def test_item_syncs_are_counted_at_the_user_line(instrument):
    inst = instrument(warmup=1, steps=100, full=True)
    _train(_data(n=48, batch=8), item_every_step=True)
    inst.close_pending()
    rows = inst.sync_site_rows()
    assert len(rows) == 1
    row = rows[0]
    line = next(
        i for i, text in enumerate(Path(__file__).read_text().splitlines(), 1) if "# SYNC-LINE" in text
    )
    assert row["location"].endswith(f"test_profile_hooks.py:{line}")
    assert row["method"] == "item"
    assert row["count"] == 6 and row["measured_count"] == 5
    # the last step's .item() runs after its optimizer step and before the next batch: same step
    assert [r["syncs"] for r in inst.records[:-1]] == [1] * 5


def test_library_item_calls_on_cpu_are_not_counted(instrument):
    inst = instrument(warmup=0, steps=100, full=True)
    model = nn.Linear(4, 2)
    opt = torch.optim.Adam(model.parameters(), foreach=False)  # Adam reads its CPU step count with .item()
    for _ in range(3):
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
    assert inst.sync_site_rows() == []


def test_loader_settings_location_overrides_and_first_batch(instrument):
    inst = instrument(warmup=0, steps=100, full=True, overrides=Overrides(dataloader={"batch_size": 16}))
    loader = _data(n=64, batch=8, shuffle=True)
    _train(loader, epochs=2)
    inst.close_pending()
    (cap,) = inst.captured.loaders
    s = cap.settings()
    line = next(
        i for i, text in enumerate(Path(__file__).read_text().splitlines(), 1) if "# LOADER-LINE" in text
    )
    assert s["location"].endswith(f"test_profile_hooks.py:{line}")
    assert s["batch_size"] == 16 and s["overrides_applied"] == {"batch_size": 16}
    assert s["num_workers"] == 0 and s["dataset_type"] == "TensorDataset" and s["dataset_len"] == 64
    assert s["iterators"] == 2 and len(s["first_batch_s"]) == 2 and s["batches_seen"] == 8
    assert len(inst.records) == 8


def test_loader_overrides_that_need_workers_are_skipped_with_a_reason(instrument):
    inst = instrument(overrides=Overrides(dataloader={"persistent_workers": True, "prefetch_factor": 4}))
    _data()
    cap = inst.captured.loaders[0]
    assert set(cap.skipped) == {"persistent_workers", "prefetch_factor"}
    assert cap.loader.persistent_workers is False


def test_model_overrides_channels_last_autocast_and_optimizer_impl(instrument):
    inst = instrument(
        warmup=0,
        steps=100,
        full=True,
        overrides=Overrides(channels_last=True, autocast="bfloat16", optimizer_impl="foreach"),
    )
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.LazyLinear(2))
    model(torch.randn(2, 3, 8, 8))  # materialise the lazy layer before the optimizer sees it
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    seen = {}
    model[0].register_forward_pre_hook(
        lambda m, a: seen.update(cl=a[0].is_contiguous(memory_format=torch.channels_last))
    )
    model[0].register_forward_hook(lambda m, a, out: seen.update(dtype=out.dtype))
    for _ in range(2):
        out = model(torch.randn(2, 3, 8, 8))
        assert out.dtype == torch.float32  # outputs leave autocast as fp32
        out.sum().backward()
        opt.step()
    assert seen == {"cl": True, "dtype": torch.bfloat16}
    assert model[0].weight.is_contiguous(memory_format=torch.channels_last)
    assert all(g["foreach"] for g in opt.param_groups)
    finish_optimizer_facts(inst.captured.optimizers, inst.optimizer_facts)
    assert inst.optimizer_facts[0]["impl"] == "foreach" and inst.optimizer_facts[0]["override"] == "foreach"


def test_default_cpu_optimizer_is_reported_as_for_loop(instrument):
    inst = instrument()
    model = nn.Linear(2, 2)
    torch.optim.SGD(model.parameters(), lr=0.1)
    finish_optimizer_facts(inst.captured.optimizers, inst.optimizer_facts)
    assert inst.optimizer_facts[0]["impl"] == "for-loop"


def test_uninstall_restores_torch():
    before = {n: torch.Tensor.__dict__.get(n) for n in ("item", "to", "backward", "__repr__", "__format__")}
    dl_init, next_ = DataLoader.__init__, torch.utils.data.dataloader._BaseDataLoaderIter.__next__
    inst = Instrumentation(Config())
    inst.install()
    assert torch.Tensor.__dict__.get("item") is not None
    inst.uninstall()
    assert {n: torch.Tensor.__dict__.get(n) for n in before} == before
    assert DataLoader.__init__ is dl_init
    assert torch.utils.data.dataloader._BaseDataLoaderIter.__next__ is next_
    assert not torch.nn.modules.module._global_forward_pre_hooks
    assert torch.tensor(3.0).item() == 3.0


def test_callback_at_loader_gets_captured_and_stops(instrument, tmp_path, monkeypatch):
    mod = tmp_path / "cbmod_hooks.py"
    mod.write_text(
        "def cb(cap):\n"
        "    ld = cap.loaders[0]\n"
        "    return {'n': len(cap.loaders), 'bs': ld.kwargs['batch_size'], 'len': len(ld.dataset)}\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    inst = instrument(callback="cbmod_hooks:cb", callback_at="loader")
    with pytest.raises(StopProfiling):
        _data(n=40, batch=5)
    assert inst.callback_result == {"n": 1, "bs": 5, "len": 40}


def test_cuda_sync_debug_warnings_are_counted_at_the_user_line():
    """torch's sync debug mode reports syncs inside torch calls; the handler attributes them to user code."""
    inst = Instrumentation(Config())
    inst.warm_done = True

    def user_code_calling_torch():
        inst.record_cuda_sync()  # what the warnings hook calls for each reported sync

    user_code_calling_torch()
    inst.syncs.busy = True
    user_code_calling_torch()  # already timed by a wrapper: not counted twice
    (row,) = inst.sync_site_rows()
    assert row["method"] == "cuda-sync" and row["measured_count"] == 1
    assert "test_profile_hooks.py" in row["location"]


def test_steps_holding_a_validation_pass_are_flagged_and_set_apart(instrument):
    from pitstop.profile.record.timeline import StepRecord, usable_steps

    inst = instrument(warmup=0, steps=100, full=True)
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for i in range(6):
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
        if i == 2:
            with torch.no_grad():
                model(torch.randn(2, 4))  # "validation" after the optimizer step: part of this step
    inst.close_pending()
    flags = [r["eval"] for r in inst.records]
    assert flags == [False, False, True, False, False, False]  # booked to the step it ran in
    recs = [StepRecord.from_dict(r) for r in inst.records]
    assert [s.index for s in usable_steps(recs)] == [0, 1, 3, 4, 5]


def test_printing_and_formatting_tensors_count_once_each(instrument, capsys):
    inst = instrument(warmup=0, steps=100, full=True)
    inst.warm_done = True
    t = torch.tensor(2.0)
    print(t)  # __repr__ (which itself calls .item() inside torch: not counted twice)
    print(f"{t:.2f}")  # __format__ -> .item()
    float(t)
    rows = sorted((r["method"], r["count"]) for r in inst.sync_site_rows())
    assert rows == [("__float__", 1), ("__format__", 1), ("__repr__", 1)]


def test_gradscaler_loop_gives_one_step_per_iteration(instrument):
    inst = instrument(warmup=0, steps=100, full=True)
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**4)
    for _ in range(5):
        loss = model(torch.randn(8, 4)).pow(2).mean()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
    inst.close_pending()
    assert len(inst.records) == 5
    assert all(r["optimizer_s"] > 0 for r in inst.records)


class _Listener:
    """Records what the instrumentation tells a rank's all-reduce timers about each backward."""

    def __init__(self) -> None:
        self.armed = 1
        self.calls: list[tuple] = []

    def backward_begin(self, location, now) -> None:
        self.calls.append(("begin", location))

    def backward_end(self, failed: bool) -> None:
        self.calls.append(("end", failed))


def test_backward_listener_is_told_where_each_backward_runs_and_whether_it_raised(instrument):
    inst = instrument(steps=100, warmup=0)
    inst.backward_listener = listener = _Listener()
    x = torch.randn(4, 3, requires_grad=True)
    (x * 2).sum().backward()  # BACKWARD-LINE
    assert listener.calls[0][0] == "begin"
    assert listener.calls[0][1].endswith(f"{Path(__file__).name}:{_line('BACKWARD-LINE')}")
    assert listener.calls[1] == ("end", False)

    def fail(grad):
        raise RuntimeError("peer gone")

    y = x * 3
    y.register_hook(fail)
    with pytest.raises(RuntimeError, match="peer gone"):
        y.sum().backward()
    assert listener.calls[-1] == ("end", True)  # the rank stays reported as blocked there
    try:
        raise ValueError("handled by the script")
    except ValueError:
        (x * 4).sum().backward()  # an exception being handled around a backward is not the backward's
    assert listener.calls[-1] == ("end", False)
    listener.armed = 0
    (x * 5).sum().backward()
    assert listener.calls[-2:] == [("end", False), ("end", False)]  # told of the end only
    assert [c[0] for c in listener.calls].count("begin") == 3
    assert inst.counts["backwards"] == 4


def _line(marker: str) -> int:
    return next(i for i, t in enumerate(Path(__file__).read_text().splitlines(), 1) if marker in t and "_line(" not in t)


def test_cuda_sync_debug_mode_that_fails_is_not_switched_inside_the_step(monkeypatch):
    """A torch whose ``set_sync_debug_mode`` raises: nothing installed, and a step never raises over it."""
    import torch

    def refuse(mode):
        raise RuntimeError("no sync debug mode here")

    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", refuse)
    inst = Instrumentation(Config())
    inst._install_cuda_sync_debug()
    assert inst.syncs.cuda_debug is False
    inst.syncs.cuda_debug = True  # on, then failing later: the step goes on
    for i in range(12):
        inst.syncs.new_step(i)


def test_loader_tables_keep_only_live_iterators_that_can_own_workers() -> None:
    """A new iterator every epoch: those without workers are not kept for the shutdown, dead ones go."""
    import gc

    from pitstop.profile.capture.loaders import LoaderTables
    from pitstop.profile.record.captured import CapturedLoader

    class WithWorkers:
        def _shutdown_workers(self) -> None: ...

    class WithoutWorkers: ...

    tables = LoaderTables()
    cap = CapturedLoader(loader=None, kwargs={}, dataset=None, location=None)
    for _ in range(20):
        tables.add_iterator(WithoutWorkers(), cap)
    assert tables.refs == []
    live = WithWorkers()
    tables.add_iterator(live, cap)
    for _ in range(20):
        tables.add_iterator(WithWorkers(), cap)  # dropped at once: dead from the next one on
        gc.collect()
    assert [r() for r in tables.refs] == [live, None]  # the live one, and the last one added
