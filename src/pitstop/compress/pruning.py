"""Magnitude pruning with ``torch.nn.utils.prune``: global unstructured, or structured by L_n norm.

Masks stay attached during the optional fine-tune (so pruned weights stay zero while the rest adapt),
then ``prune.remove`` makes the zeros permanent: the result is a plain model with zeros in its weights.
Dense zeros do not make a model smaller on disk or faster by themselves; the report measures both and
says so (gzip size shows what the zeros are worth in storage).
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from torch import nn
from torch.nn.utils import prune as tprune

from pitstop.compress.loop import StepsResult, run_steps
from pitstop.compress.measure import PRUNABLE, Sparsity, sparsity
from pitstop.compress.shrink import Shrunk, remove_dead_channels


@dataclass
class Pruned:
    model: nn.Module
    amount: float
    structured: bool
    layers: int
    sparsity: Sparsity
    finetune: StepsResult | None
    shrunk: Shrunk | None = None


def prunable_layers(model: nn.Module, skip_output: bool = False) -> list[tuple[str, nn.Module]]:
    """Linear/Conv layers with a weight, in module order; ``skip_output`` leaves out the last one
    (structured pruning of the output layer would delete classes)."""
    layers = [(n, m) for n, m in model.named_modules() if isinstance(m, PRUNABLE) and m.weight is not None]
    return layers[:-1] if skip_output and len(layers) > 1 else layers


def prune_detailed(
    model: nn.Module,
    amount: float = 0.5,
    structured: bool = False,
    n: int | float = 2,
    finetune_loader: Iterable[Any] | None = None,
    finetune_steps: int = 0,
    lr: float = 1e-3,
    seed: int | None = 0,
    inplace: bool = False,
    remove_channels: bool = False,
) -> Pruned:
    if not 0.0 <= amount < 1.0:
        raise ValueError(f"amount must be in [0, 1), got {amount}")
    if not inplace:
        model = copy.deepcopy(model)
    layers = prunable_layers(model, skip_output=structured)
    if not layers:
        raise ValueError("the model has no Linear/Conv layers to prune")
    if structured:
        for _, mod in layers:
            tprune.ln_structured(mod, "weight", amount=amount, n=n, dim=0)
    else:
        tprune.global_unstructured(
            [(mod, "weight") for _, mod in layers], pruning_method=tprune.L1Unstructured, amount=amount
        )
    ft = None
    if finetune_loader is not None and finetune_steps > 0:
        ft = run_steps(model, finetune_loader, finetune_steps, lr=lr, seed=seed)
    for _, mod in layers:
        tprune.remove(mod, "weight")
    model.eval()
    shrunk = remove_dead_channels(model) if structured and remove_channels else None
    return Pruned(model, amount, structured, len(layers), sparsity(model), ft, shrunk)


def prune(model: nn.Module, *args: Any, **kwargs: Any) -> nn.Module:
    """Prune ``model``'s Linear/Conv weights and return it with the zeros made permanent.

    unstructured (default): the ``amount`` fraction of smallest-magnitude weights across all layers at
    once (global L1). structured: in each layer but the output layer, the ``amount`` fraction of output
    channels (rows) with the smallest L_n norm. With ``finetune_loader`` and ``finetune_steps`` > 0,
    trains that many steps with the masks on before making them permanent. ``remove_channels`` (with
    ``structured``): delete the zeroed channels from the layers where that is exact (see
    ``pitstop.compress.shrink``), so the model gets smaller and faster; its state_dict shapes change.

    Takes the arguments of ``prune_detailed``; returns only its model.
    """
    return prune_detailed(model, *args, **kwargs).model


prune.__signature__ = inspect.signature(prune_detailed).replace(return_annotation=nn.Module)  # type: ignore[attr-defined]
