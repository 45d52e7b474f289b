"""Training metrics without per-step host syncs: sums stay on the device, read every N steps.

``loss.item()`` each step blocks the CPU until the GPU catches up, emptying its queue of work; here the
detached loss is added to a device tensor and copied back once per ``read()``. ``FitResult``: what
``fit`` measured in all.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import torch


class RunningMean:
    """Sample-weighted mean of per-batch values (e.g. losses), accumulated on ``device``."""

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)
        self._sum = torch.zeros((), dtype=torch.float64, device=self.device)
        self._count = 0

    def update(self, value: torch.Tensor, n: int = 1) -> None:
        """Add a batch's mean ``value`` over ``n`` samples. No sync: ``n`` is a Python int."""
        self._sum += value.detach().to(torch.float64) * n
        self._count += n

    @property
    def count(self) -> int:
        return self._count

    def read(self, reset: bool = True) -> float:
        """The mean so far (one device-to-host copy), then start over if ``reset``."""
        if self._count == 0:
            return float("nan")
        mean = float(self._sum.item()) / self._count
        if reset:
            self._sum.zero_()
            self._count = 0
        return mean


def batch_size(batch: object) -> int:
    """Samples in a batch: the leading dimension of its first tensor (shapes are host metadata: no sync)."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else 1
    if isinstance(batch, (list, tuple)) and batch:
        return batch_size(batch[0])
    if isinstance(batch, dict) and batch:
        return batch_size(next(iter(batch.values())))
    return 1


@dataclass
class FitResult:
    """What ``fit`` did and measured: steps, throughput, the loss history and the settings applied."""

    steps: int
    epochs_completed: int
    samples: int
    elapsed_s: float
    samples_per_s: float
    history: list[dict[str, float]] = field(default_factory=list)
    val: list[dict[str, float]] = field(default_factory=list)
    applied: dict[str, Any] = field(default_factory=dict)
    resumed_from_step: int | None = None
    interrupted: bool = False

    @property
    def final_loss(self) -> float:
        return self.history[-1]["loss"] if self.history else float("nan")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
