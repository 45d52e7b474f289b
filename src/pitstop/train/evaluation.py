"""``evaluate``: a model's mean loss (and accuracy, for class logits) over a loader, and the default way
``fit`` and ``evaluate`` compute a batch's loss."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.distributed as dist

from pitstop.train.amp import Amp
from pitstop.train.metrics import batch_size
from pitstop.train.prefetch import move_to

LossFn = Callable[[Any, Any], torch.Tensor]  # (output, target) -> loss
ComputeLoss = Callable[[torch.nn.Module, Any], torch.Tensor]  # (model, batch) -> loss


def default_compute_loss(loss_fn: LossFn | None) -> ComputeLoss:
    """``(x, y)`` batches: ``loss_fn(model(x), y)``; dict batches: ``model(**batch)`` returning a loss."""

    def compute(model: torch.nn.Module, batch: Any) -> torch.Tensor:
        if isinstance(batch, dict):
            out = model(**batch)
            return out if loss_fn is None else loss_fn(out, batch)
        if isinstance(batch, (list, tuple)) and len(batch) == 2 and loss_fn is not None:
            x, y = batch
            return loss_fn(model(x), y)
        raise TypeError("fit: give loss_fn for (input, target) batches, or compute_loss(model, batch)")

    return compute


@torch.no_grad()
def evaluate(
    model: torch.nn.Module,
    loader: Iterable[Any],
    loss_fn: LossFn | None = None,
    compute_loss: ComputeLoss | None = None,
    amp: Amp | None = None,
    device: torch.device | str = "cpu",
    all_ranks: bool = False,
) -> dict[str, float]:
    """Mean loss over ``loader`` and, for ``(x, y)`` batches with class logits, accuracy. One sync at the end.

    ``(x, y)`` batches with ``loss_fn``: ``loss_fn(model(x), y)``; otherwise ``compute_loss(model, batch)``.
    ``all_ranks``: every rank evaluates its share (e.g. a DistributedSampler) and the totals are summed
    over ranks, so all ranks return the same numbers.
    """
    if loss_fn is None and compute_loss is None:
        raise ValueError("evaluate needs loss_fn or compute_loss")
    was_training = model.training
    model.eval()
    dev = torch.device(device)
    ctx = amp.autocast if amp is not None else contextlib.nullcontext
    # [loss sum, samples, correct, classified samples], on the device until the end.
    totals = torch.zeros(4, dtype=torch.float64, device=dev)
    for batch in loader:
        batch = move_to(batch, dev)
        n = batch_size(batch)
        with ctx():
            if loss_fn is not None and isinstance(batch, (list, tuple)) and len(batch) == 2:
                x, y = batch
                out = model(x)
                value = loss_fn(out, y)
                if (
                    isinstance(out, torch.Tensor)
                    and out.dim() == 2
                    and y.dim() == 1
                    and not y.is_floating_point()
                ):
                    totals[2] += (out.argmax(1) == y).sum()
                    totals[3] += n
            else:
                value = (compute_loss or default_compute_loss(loss_fn))(model, batch)
        totals[0] += value.detach().double() * n
        totals[1] += n
    model.train(was_training)
    if all_ranks and dist.is_initialized():
        dist.all_reduce(totals)
    loss_sum, count, correct, n_cls = totals.tolist()
    res = {"loss": loss_sum / count if count else float("nan")}
    if n_cls:
        res["accuracy"] = correct / n_cls
    return res
