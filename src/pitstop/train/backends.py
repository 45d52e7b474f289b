"""Backend switches that are free speed on CUDA: TF32 matmuls/convs (``pitstop.recipes.tf32``) and cuDNN
autotuning (``pitstop.recipes.cudnn_benchmark``)."""

from __future__ import annotations

import torch

from pitstop.recipes import cudnn_benchmark as cudnn_component
from pitstop.recipes import tf32 as tf32_component


def configure_backends(device: torch.device | str, tf32: bool = True, cudnn_benchmark: bool = True) -> dict:
    """Turn on TF32 (Ampere+) and ``cudnn.benchmark`` for CUDA (each component's ``apply``); nothing on
    CPU. Returns what was set.

    cudnn.benchmark picks the fastest conv algorithm per input shape; with shapes that change every
    step it re-tunes each time, so pass ``cudnn_benchmark=False`` for variable-size inputs.
    """
    dev = torch.device(device).type
    if dev != "cuda":
        return {}
    return {**tf32_component.apply(dev, tf32), **cudnn_component.apply(dev, cudnn_benchmark)}
