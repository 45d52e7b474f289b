"""float32 instead of float64: a float64 model runs every matmul and convolution at half the float32
rate or less (a quarter or worse on GPUs without fast fp64), and moves twice the bytes.

The model's float64 parameters and buffers become float32 in place (the ``Parameter`` objects stay, so
an optimizer built on them keeps working, provided it has no state yet), and float64 batches float32.
Tensors of other dtypes are left as they are.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._pytree import tree_map_only


def float32_model(model: torch.nn.Module) -> torch.nn.Module:
    """``model``'s float64 parameters, their gradients and its float64 buffers as float32, in place."""
    with torch.no_grad():
        for t in [*model.parameters(), *model.buffers()]:
            if t.dtype == torch.float64:
                t.data = t.data.float()
                if t.grad is not None:
                    t.grad = t.grad.float()
    return model


def has_float64(model: torch.nn.Module) -> bool:
    return any(t.dtype == torch.float64 for t in [*model.parameters(), *model.buffers()])


def float32_inputs(batch: Any) -> Any:
    """Every float64 tensor in ``batch`` (nested tuples, lists, dicts) as float32."""
    return tree_map_only(torch.Tensor, lambda t: t.float() if t.dtype == torch.float64 else t, batch)


def float64_outputs(out: Any) -> Any:
    """Every float32 tensor in ``out`` as float64: what a float64 model returned, for the loss after it."""
    return tree_map_only(torch.Tensor, lambda t: t.double() if t.dtype == torch.float32 else t, out)
