"""Host-to-device copy time of a batch from pageable vs pinned memory (CUDA only), timed with CUDA events."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any


def tensors_of(batch: Any) -> list[Any]:
    import torch

    if isinstance(batch, torch.Tensor):
        return [batch]
    if isinstance(batch, dict):
        batch = list(batch.values())
    if isinstance(batch, list | tuple):
        return [t for b in batch for t in tensors_of(b)]
    return []


def cuda_copy_time(tensors: list[Any], device: str) -> float:
    """Seconds to copy ``tensors`` to ``device`` with non_blocking=True, measured by CUDA events."""
    import torch

    torch.cuda.synchronize(device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for t in tensors:
        t.to(device, non_blocking=True)
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1000.0


def measure_h2d(
    batch: Any,
    device: str = "cuda",
    repeats: int = 10,
    copy_time: Callable[[list[Any], str], float] = cuda_copy_time,
) -> dict[str, Any]:
    """Median copy time of the batch from pageable and from pinned memory, interleaved after a warm-up."""
    pageable = [t.contiguous() for t in tensors_of(batch)]
    pinned = [t.pin_memory() for t in pageable]
    for ts in (pageable, pinned):
        copy_time(ts, device)
    page_t, pin_t = [], []
    for _ in range(repeats):
        page_t.append(copy_time(pageable, device))
        pin_t.append(copy_time(pinned, device))
    return {
        "device": device,
        "bytes": sum(t.numel() * t.element_size() for t in pageable),
        "pageable_s": statistics.median(page_t),
        "pinned_s": statistics.median(pin_t),
        "repeats": repeats,
    }
