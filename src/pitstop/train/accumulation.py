"""Gradient accumulation: k micro-batches per optimizer step, with the loss scaled by 1/k.

Under DDP every backward all-reduces gradients; ``no_sync`` skips that on all but the last
micro-batch, so k micro-batches cost one all-reduce instead of k.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import TypeVar

import torch

T = TypeVar("T")


def sync_context(model: torch.nn.Module, sync: bool) -> contextlib.AbstractContextManager:
    """Skip the gradient all-reduce when ``sync`` is False: DDP's ``no_sync()``, or FSDP2's
    ``set_requires_gradient_sync(False)`` for the duration; a no-op for plain models or when syncing.

    Wrap the micro-batch's forward *and* backward in it (the reduction is triggered by backward).
    """
    if sync:
        return contextlib.nullcontext()
    if hasattr(model, "no_sync"):
        return model.no_sync()  # type: ignore[operator]
    if hasattr(model, "set_requires_gradient_sync"):
        return _fsdp2_no_sync(model)
    return contextlib.nullcontext()


@contextlib.contextmanager
def _fsdp2_no_sync(model: torch.nn.Module) -> Iterator[None]:
    model.set_requires_gradient_sync(False)  # type: ignore[operator]
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)  # type: ignore[operator]


def scale_loss(loss: torch.Tensor, accum_steps: int) -> torch.Tensor:
    """Divide by k so the summed gradients equal the mean-loss gradient of one k-times-larger batch."""
    return loss / accum_steps if accum_steps > 1 else loss


def accumulate(batches: Iterable[T], accum_steps: int) -> Iterator[tuple[T, bool]]:
    """Yield ``(batch, is_last_micro_batch)``; the flag says: sync gradients and step the optimizer now.

    A trailing group shorter than k still ends with True so no gradient is left unapplied (its loss is
    then scaled by 1/k, a slightly smaller step, as in most frameworks).
    """
    if accum_steps < 1:
        raise ValueError(f"accum_steps must be >= 1, got {accum_steps}")
    it = iter(batches)
    try:
        nxt = next(it)
    except StopIteration:
        return
    i = 0
    while True:
        cur = nxt
        try:
            nxt = next(it)
        except StopIteration:
            yield cur, True
            return
        i += 1
        yield cur, i % accum_steps == 0


def optimizer_steps_per_epoch(num_batches: int, accum_steps: int) -> int:
    """Optimizer steps one epoch of ``num_batches`` micro-batches makes (a short tail still steps)."""
    return -(-num_batches // accum_steps)


def no_sync_every(every: int):
    """Gradient accumulation without DDP's per-micro-batch all-reduce, for a loop that calls
    ``loss.backward()`` ``every`` times per ``optimizer.step()`` and never ``model.no_sync()``: from the
    first optimizer step on, every DDP forward but each ``every``-th runs as under ``no_sync()``, and a
    step reached after an unsynced forward (an uneven last accumulation) all-reduces the gradients
    first, as DDP would, so every step sees the same averaged gradients as without it. It is the
    mechanism ``pitstop fix`` measured as its ``no_sync`` candidate (``pitstop.train.ddp_inject``);
    call it once before training. Returns the installed injection (``.uninstall()`` undoes it)."""
    from pitstop.train.ddp_inject import install

    return install(every=int(every))
