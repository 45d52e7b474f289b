from __future__ import annotations

import contextlib

import pytest
import torch

from pitstop.recipes.step import accumulate, optimizer_steps_per_epoch, scale_loss, sync_context
from pitstop.train import TrainConfig, fit


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def test_k_micro_batches_equal_one_big_batch() -> None:
    torch.manual_seed(1)
    x, y = torch.randn(24, 6), torch.randint(0, 3, (24,))
    big = _model()
    torch.nn.functional.cross_entropy(big(x), y).backward()
    small = _model()
    k = 4
    flags = []
    for (xb, yb), last in accumulate(zip(x.chunk(k), y.chunk(k), strict=True), k):
        scale_loss(torch.nn.functional.cross_entropy(small(xb), yb), k).backward()
        flags.append(last)
    assert flags == [False, False, False, True]
    for a, b in zip(big.parameters(), small.parameters(), strict=True):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-5, atol=1e-6)


def test_without_scaling_gradients_are_k_times_too_big() -> None:
    # The check above can fail: dropping the 1/k scale gives k-times gradients.
    torch.manual_seed(1)
    x, y = torch.randn(8, 6), torch.randint(0, 3, (8,))
    big, small = _model(), _model()
    torch.nn.functional.cross_entropy(big(x), y).backward()
    for xb, yb in zip(x.chunk(2), y.chunk(2), strict=True):
        torch.nn.functional.cross_entropy(small(xb), yb).backward()
    assert not torch.allclose(big[0].weight.grad, small[0].weight.grad)


def test_accumulate_flags_and_tail() -> None:
    assert [last for _, last in accumulate(range(7), 3)] == [False, False, True, False, False, True, True]
    assert list(accumulate([], 2)) == []
    assert [last for _, last in accumulate(range(3), 1)] == [True, True, True]
    with pytest.raises(ValueError):
        list(accumulate(range(3), 0))
    assert optimizer_steps_per_epoch(7, 3) == 3


class _FakeDDP(torch.nn.Module):
    """Counts no_sync entries the way DDP would use them."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.module = inner
        self.unsynced_backwards = 0
        self.synced_backwards = 0
        self._in_no_sync = False

    @contextlib.contextmanager
    def no_sync(self):  # type: ignore[no-untyped-def]
        self._in_no_sync = True
        try:
            yield
        finally:
            self._in_no_sync = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.module(x)
        unsynced = self._in_no_sync

        def hook(g: torch.Tensor) -> torch.Tensor:
            if unsynced:
                self.unsynced_backwards += 1
            else:
                self.synced_backwards += 1
            return g

        out.register_hook(hook)
        return out


def test_fit_uses_no_sync_on_all_but_last_micro_batch_and_steps_scheduler_per_step() -> None:
    x, y = torch.randn(40, 6), torch.randint(0, 3, (40,))
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(x, y), batch_size=4
    )  # 10 micro-batches
    model = _FakeDDP(_model())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    res = fit(
        model,
        opt,
        loader,
        torch.nn.functional.cross_entropy,
        TrainConfig(accum_steps=3, precision="fp32", progress=False, distributed="none"),
        scheduler=sched,
    )
    assert res.steps == 4  # 3 + 3 + 3 + a tail of 1
    assert model.synced_backwards == 4 and model.unsynced_backwards == 6
    assert opt.param_groups[0]["lr"] == pytest.approx(0.1 * 0.5**4)
    assert res.samples == 40


def test_sync_context_is_noop_without_no_sync() -> None:
    with sync_context(torch.nn.Linear(2, 2), sync=False):
        pass
