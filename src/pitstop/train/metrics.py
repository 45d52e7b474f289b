"""Training metrics without per-step host syncs: sums stay on the device, read every N steps.

``loss.item()`` each step blocks the CPU until the GPU catches up, emptying its queue of work; here the
detached loss is added to a device tensor and copied back once per ``read()``.
"""

from __future__ import annotations

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
