"""channels_last (NHWC) for conv nets: oneDNN on CPU and cuDNN tensor cores run NHWC convolutions faster.

Both the model and its 4-d inputs must be converted; a mismatch makes every conv convert on the fly.
"""

from __future__ import annotations

from typing import Any

import torch

_CONVS = (torch.nn.Conv2d, torch.nn.ConvTranspose2d)


def has_conv2d(model: torch.nn.Module) -> bool:
    return any(isinstance(m, _CONVS) for m in model.modules())


def to_channels_last(model: torch.nn.Module) -> torch.nn.Module:
    """Convert a conv net's 4-d weights to channels_last in place (other parameters are untouched)."""
    return model.to(memory_format=torch.channels_last)


def channels_last_input(batch: Any) -> Any:
    """Convert every 4-d floating tensor in ``batch`` (tensor, tuple, list or dict) to channels_last."""
    if isinstance(batch, torch.Tensor):
        if batch.dim() == 4 and batch.is_floating_point():
            return batch.contiguous(memory_format=torch.channels_last)
        return batch
    if isinstance(batch, (list, tuple)):
        out = [channels_last_input(b) for b in batch]
        return type(batch)(out) if not hasattr(batch, "_fields") else type(batch)(*out)
    if isinstance(batch, dict):
        return {k: channels_last_input(v) for k, v in batch.items()}
    return batch
