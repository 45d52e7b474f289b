"""Backend switches that are free speed on CUDA: TF32 matmuls/convs and cuDNN autotuning."""

from __future__ import annotations

import torch


def configure_backends(device: torch.device | str, tf32: bool = True, cudnn_benchmark: bool = True) -> dict:
    """Turn on TF32 (Ampere+) and ``cudnn.benchmark`` for CUDA; nothing on CPU. Returns what was set.

    cudnn.benchmark picks the fastest conv algorithm per input shape; with shapes that change every
    step it re-tunes each time, so pass ``cudnn_benchmark=False`` for variable-size inputs.
    """
    if torch.device(device).type != "cuda":
        return {}
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.set_float32_matmul_precision("high" if tf32 else "highest")
    torch.backends.cudnn.benchmark = cudnn_benchmark
    return {"tf32": tf32, "cudnn_benchmark": cudnn_benchmark}
