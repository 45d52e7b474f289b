"""``fit`` on a loader whose ``len()`` overstates what it yields: an epoch ends when its iterator does."""

from __future__ import annotations

from collections.abc import Iterator

import torch

from pitstop.train import TrainConfig, fit


class ShortLoader:
    """Says 10 batches, yields 3; refuses to be iterated more often than ``limit`` (so a loop that never
    ends its epoch fails here instead of hanging)."""

    def __init__(self, limit: int) -> None:
        self.iterations = 0
        self.limit = limit

    def __len__(self) -> int:
        return 10

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        self.iterations += 1
        if self.iterations > self.limit:
            raise RuntimeError(f"iterated {self.iterations} times for {self.limit} epochs")
        g = torch.Generator().manual_seed(self.iterations)
        for _ in range(3):
            yield torch.randn(4, 3, generator=g), torch.randint(0, 2, (4,), generator=g)


def test_an_epoch_ends_when_the_loader_is_exhausted() -> None:
    loader = ShortLoader(limit=2)
    res = fit(
        torch.nn.Linear(3, 2),
        None,
        loader,
        torch.nn.functional.cross_entropy,
        TrainConfig(epochs=2, progress=False, compile=False, device="cpu", distributed="none"),
    )
    assert loader.iterations == 2
    assert res.epochs_completed == 2
    assert res.steps == 6 and res.samples == 24


def test_accumulation_steps_on_the_short_tail_of_an_exhausted_loader() -> None:
    loader = ShortLoader(limit=1)
    res = fit(
        torch.nn.Linear(3, 2),
        None,
        loader,
        torch.nn.functional.cross_entropy,
        TrainConfig(epochs=1, accum_steps=2, progress=False, compile=False, device="cpu", distributed="none"),
    )
    assert res.epochs_completed == 1 and res.steps == 2
