"""Step boundaries for every common loop shape, and phases that add up to the step."""

from __future__ import annotations

import torch
from torch import nn

from pitstop.profile.capture.hooks import Config, Instrumentation
from pitstop.profile.capture.stepclock import BACKWARDS_BEFORE_FALLBACK, PHASES

torch.set_num_threads(1)


def _parts_add_up(records):
    assert records
    for r in records:
        parts = sum(r[p] for p in PHASES)
        assert parts <= r["total_s"] + 1e-9, r


def test_manual_sgd_without_an_optimizer_is_stepped_by_backward(instrument):
    inst = instrument()
    model = nn.Linear(4, 2)
    n = 10
    for _ in range(n):
        loss = model(torch.randn(8, 4)).pow(2).mean()
        model.zero_grad()
        loss.backward()
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-0.1)
        loss.item()
    inst.close_pending()
    snap = inst.snapshot("completed", final=False)
    assert snap["step_boundary"] == "backward()"
    # the iterations before the choice ran as one and are not recorded
    assert len(inst.records) == n - BACKWARDS_BEFORE_FALLBACK
    assert all(r["forward_s"] > 0 and r["backward_s"] > 0 and r["syncs"] == 1 for r in inst.records)
    assert all(t is not None for t in inst.losses)
    _parts_add_up(inst.records)


def test_torch_autograd_backward_and_grad_also_delimit_steps(instrument):
    """Custom updates: ``torch.autograd.backward`` and ``torch.autograd.grad`` (what ``torch.func.grad``
    calls) are backward calls too."""
    inst = instrument()
    model = nn.Linear(4, 2)
    params = list(model.parameters())
    for i in range(8):
        loss = model(torch.randn(8, 4)).pow(2).mean()
        if i % 2:
            model.zero_grad()
            torch.autograd.backward(loss)
            grads = [p.grad for p in params]
        else:
            grads = torch.autograd.grad(loss, params)
        with torch.no_grad():
            for p, g in zip(params, grads, strict=True):
                p -= 0.01 * g
    inst.close_pending()
    assert inst.clock.boundary_label() == "backward()"
    assert len(inst.records) == 8 - BACKWARDS_BEFORE_FALLBACK
    assert all(r["backward_s"] > 0 and r["forward_s"] > 0 for r in inst.records)


def test_torch_func_grad_loop_is_stepped_by_its_backward(instrument):
    from torch.func import functional_call, grad

    inst = instrument()
    model = nn.Linear(4, 2)
    params = {k: v.detach() for k, v in model.named_parameters()}

    def loss_fn(p, x):
        return functional_call(model, p, (x,)).pow(2).mean()

    for _ in range(8):
        g = grad(loss_fn)(params, torch.randn(8, 4))
        params = {k: params[k] - 0.1 * g[k] for k in params}
    inst.close_pending()
    assert inst.clock.boundary_label() == "backward()"
    assert len(inst.records) == 8 - BACKWARDS_BEFORE_FALLBACK
    assert all(r["forward_s"] > 0 and r["backward_s"] > 0 for r in inst.records)


def test_a_loop_without_modules_or_loaders_is_stepped_backward_to_backward(instrument):
    inst = instrument()
    w = torch.randn(4, requires_grad=True)
    for _ in range(8):
        loss = (w * torch.randn(4)).sum() ** 2
        loss.backward()
        with torch.no_grad():
            w -= 0.01 * w.grad
            w.grad = None
    inst.close_pending()
    assert inst.clock.boundary_label() == "backward()"
    assert len(inst.records) == 8 - BACKWARDS_BEFORE_FALLBACK
    assert all(r["backward_s"] > 0 for r in inst.records)
    _parts_add_up(inst.records)


def test_gradient_accumulation_counts_one_step_per_optimizer_step(instrument):
    inst = instrument()
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    accum, opt_steps = 4, 6  # more micro-batches per step than the backward fallback waits for
    for i in range(accum * opt_steps):
        (model(torch.randn(8, 4)).pow(2).mean() / accum).backward()
        if (i + 1) % accum == 0:
            opt.step()
            opt.zero_grad()
    inst.close_pending()
    assert inst.clock.boundary_label() == "optimizer.step()"
    # the first period straddled the switch from backward to optimizer steps: measured from the second
    assert len(inst.records) == opt_steps - 1
    assert all(r["optimizer_s"] > 0 and r["forward_s"] > 0 and r["backward_s"] > 0 for r in inst.records)
    _parts_add_up(inst.records)


def test_lbfgs_closure_is_forward_and_backward_not_optimizer(instrument):
    inst = instrument()
    model = nn.Linear(4, 1)
    opt = torch.optim.LBFGS(model.parameters(), lr=0.1, max_iter=4)
    x, y = torch.randn(16, 4), torch.randn(16, 1)
    forwards = []

    def closure():
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        forwards.append(1)
        return loss

    for _ in range(5):
        opt.step(closure)
    inst.close_pending()
    assert len(forwards) > 5  # several forwards per optimizer step
    assert len(inst.records) == 5
    assert inst.counts["forwards"] == len(forwards)
    for r in inst.records:
        assert r["forward_s"] > 0 and r["backward_s"] > 0 and r["optimizer_s"] > 0
    _parts_add_up(inst.records)


def test_a_closure_loop_like_lightning_automatic_optimization(instrument):
    """``optimizer.step(closure)`` with the training step and backward inside the closure."""
    inst = instrument()
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(torch.randn(64, 16), torch.randn(64, 1)), batch_size=8
    )
    for x, y in loader:

        def closure(x=x, y=y):
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            return loss

        opt.step(closure=closure)
    inst.close_pending()
    assert len(inst.records) == 8
    for r in inst.records:
        assert r["forward_s"] > 0 and r["backward_s"] > 0 and r["data_wait_s"] > 0
    _parts_add_up(inst.records)


def test_a_sync_inside_forward_is_counted_once(instrument):
    class Checks(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 2)

        def forward(self, x):
            out = self.fc(x)
            if out.abs().max().item() > 1e6:  # a sync inside the model
                raise RuntimeError
            return out

    inst = instrument()
    model = Checks()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(5):
        model(torch.randn(8, 4)).sum().backward()
        opt.step()
    inst.close_pending()
    assert all(r["syncs"] == 1 for r in inst.records)
    _parts_add_up(inst.records)


def test_no_optimizer_and_no_backward_gives_no_step(instrument):
    inst = instrument()
    model = nn.Linear(4, 2)
    with torch.no_grad():
        for _ in range(6):
            model(torch.randn(2, 4))
    inst.close_pending()
    assert inst.records == []
    assert inst.snapshot("completed", final=False)["step_boundary"] is None
    assert inst.totals().forwards == 6


def test_copies_and_submodule_calls_of_a_known_model(instrument):
    inst = instrument()
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ema = None
    for _ in range(4):
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
        model[0](torch.randn(2, 4))  # a part of the model, called alone: not a new model
        ema = ema or __import__("copy").deepcopy(model)
        with torch.no_grad():
            ema(torch.randn(2, 4))  # a copy is a model of its own
    assert [id(m) for m in inst.captured.models] == [id(model), id(ema)]


def test_uninstall_leaves_nothing_patched():
    from torch.nn.modules import module as mod
    from torch.optim import optimizer as optmod
    from torch.utils.data import DataLoader
    from torch.utils.data.dataloader import _BaseDataLoaderIter

    owners = (torch.Tensor, DataLoader, _BaseDataLoaderIter, torch.optim.Optimizer, torch.autograd, mod)

    def state():
        return (
            [dict(vars(o)) for o in owners],
            [
                dict(d)
                for d in (
                    mod._global_forward_pre_hooks,
                    mod._global_forward_hooks,
                    mod._global_forward_hooks_always_called,
                    mod._global_forward_hooks_with_kwargs,
                    optmod._global_optimizer_pre_hooks,
                    optmod._global_optimizer_post_hooks,
                )
            ],
            list(__import__("warnings").filters),
        )

    before = state()
    inst = Instrumentation(Config(warmup=0, steps=100, full=True))
    inst.install()
    assert state() != before
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
    inst.uninstall()
    assert state() == before
    assert not mod._has_any_global_hook()
