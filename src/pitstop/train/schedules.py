"""LR schedules stepped per optimizer step, with the step count derived from the loader.

The classic bug: OneCycleLR built with ``len(loader) * epochs`` while accumulating k micro-batches,
so the cycle is k times too long (LR never comes down), or the scheduler stepped per micro-batch so it
runs out and raises. Here the total is computed once, from loader length, epochs and accumulation.
"""

from __future__ import annotations

from collections.abc import Sized

import torch

from pitstop.recipes.step import optimizer_steps_per_epoch


def total_steps(loader: Sized | int, epochs: int, accum_steps: int = 1) -> int:
    """Optimizer steps in a run: ceil(batches per epoch / k) * epochs (a short tail still steps)."""
    n = loader if isinstance(loader, int) else len(loader)
    if n <= 0 or epochs <= 0:
        raise ValueError(f"need batches and epochs > 0, got {n} batches, {epochs} epochs")
    return optimizer_steps_per_epoch(n, accum_steps) * epochs


def one_cycle(
    optimizer: torch.optim.Optimizer,
    max_lr: float | list[float],
    loader: Sized | int,
    epochs: int,
    accum_steps: int = 1,
    **kwargs: object,
) -> torch.optim.lr_scheduler.OneCycleLR:
    """OneCycleLR over exactly the run's optimizer steps; call ``.step()`` after each optimizer step."""
    return torch.optim.lr_scheduler.OneCycleLR(
        optimizer, max_lr=max_lr, total_steps=total_steps(loader, epochs, accum_steps), **kwargs
    )


def cyclic(
    optimizer: torch.optim.Optimizer,
    base_lr: float,
    max_lr: float,
    loader: Sized | int,
    cycles_per_epoch: float = 0.5,
    accum_steps: int = 1,
    **kwargs: object,
) -> torch.optim.lr_scheduler.CyclicLR:
    """CyclicLR whose up-phase spans a fraction of an epoch in optimizer steps (default: half an epoch up,
    half down = one cycle per epoch). Momentum is cycled only for SGD with momentum > 0, so the
    optimizer's own settings are not silently replaced.
    """
    per_epoch = optimizer_steps_per_epoch(loader if isinstance(loader, int) else len(loader), accum_steps)
    step_size_up = max(1, round(per_epoch * cycles_per_epoch))
    kwargs.setdefault("cycle_momentum", float(optimizer.defaults.get("momentum", 0) or 0) > 0)
    return torch.optim.lr_scheduler.CyclicLR(
        optimizer, base_lr=base_lr, max_lr=max_lr, step_size_up=step_size_up, **kwargs
    )


def make_scheduler(
    schedule: str | None,
    optimizer: torch.optim.Optimizer,
    n_batches: int,
    epochs: int,
    accum_steps: int,
    max_lr: float,
    base_lr: float | None = None,
    max_steps: int | None = None,
) -> torch.optim.lr_scheduler.LRScheduler | None:
    """``pitstop.train``'s ``schedule``: None, "onecycle" (its cycle ends where training ends, at
    ``max_steps`` where that comes first) or "cyclic" (from ``base_lr``, by default a tenth of ``max_lr``)."""
    if schedule is None:
        return None
    if schedule == "onecycle":
        planned = total_steps(n_batches, epochs, accum_steps)
        if max_steps is not None and max_steps < planned:
            return one_cycle(optimizer, max_lr, max_steps, epochs=1)
        return one_cycle(optimizer, max_lr, n_batches, epochs, accum_steps)
    if schedule == "cyclic":
        base = base_lr if base_lr is not None else max_lr / 10
        return cyclic(optimizer, base, max_lr, n_batches, accum_steps=accum_steps)
    raise ValueError(f"schedule must be None, 'onecycle' or 'cyclic', got {schedule!r}")
