"""What a batch size's step holds in memory: ``CudaMeter`` (the allocator's peak) and ``CpuMeter`` (a
tensor tracker, since a CPU keeps no allocator statistics), and ``is_oom`` for the error a size that does
not fit raises. ``pitstop.tune.batch_size`` measures each size with them."""

from __future__ import annotations

import contextlib
import ctypes
import gc
from collections.abc import Iterator
from typing import Any


def _malloc_trim() -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


class CpuMeter:
    """Peak live tensor bytes of a size's first step, from a tensor tracker (deterministic).

    The process RSS high-water mark was tried first and was not usable: glibc's adaptive mmap threshold
    and heap fragmentation moved the same size's reading by 2x between runs, so the answer did too.
    The tracker counts every storage an op creates until it is freed; allocator overhead and C++
    scratch buffers are not included, which the default budget (half of available RAM) leaves room for.
    """

    name = "peak live tensor memory (CPU tensor tracker)"

    def __init__(self, model: Any = None, optimizer: Any = None) -> None:
        self._preexisting = _state_tensors(model, optimizer)
        self._tracker: Any = None

    def reset(self) -> None:
        self._tracker = None

    @contextlib.contextmanager
    def track(self) -> Iterator[None]:
        from pitstop.train.memory import TensorMemoryTracker

        with TensorMemoryTracker(self._preexisting) as tracker:
            self._tracker = tracker
            yield

    def peak(self) -> int:
        t = self._tracker
        return 0 if t is None else max(0, t.peak_bytes - t.baseline_bytes)

    def cleanup(self, full: bool = False) -> None:
        if full:  # after an OOM: frames and cycles may still hold the step's tensors
            gc.collect()
        _malloc_trim()  # hand a large size's freed heap back to the system


def _state_tensors(model: Any, optimizer: Any) -> list[Any]:
    """Parameters, buffers and optimizer state: memory held before a size's step starts."""
    import torch

    out: list[Any] = []
    if model is not None:
        out += list(model.parameters()) + list(model.buffers())
    if optimizer is not None:
        for state in optimizer.state.values():
            out += [v for v in state.values() if isinstance(v, torch.Tensor)]
    return out


class CudaMeter:
    """Growth of ``torch.cuda.max_memory_allocated`` over all of a size's steps."""

    name = "cuda max_memory_allocated"

    def __init__(self, device: Any) -> None:
        import torch

        self.device = device
        torch.cuda.synchronize(device)
        self.origin = torch.cuda.memory_allocated(device)

    def reset(self) -> None:
        import torch

        torch.cuda.reset_peak_memory_stats(self.device)

    @contextlib.contextmanager
    def track(self) -> Iterator[None]:
        yield  # the allocator keeps the peak by itself

    def peak(self) -> int:
        import torch

        return max(0, torch.cuda.max_memory_allocated(self.device) - self.origin)

    def cleanup(self, full: bool = False) -> None:
        import torch

        if full:
            gc.collect()
        torch.cuda.empty_cache()


def is_oom(exc: BaseException) -> bool:
    import torch

    if isinstance(exc, torch.cuda.OutOfMemoryError | MemoryError):
        return True
    return isinstance(exc, RuntimeError) and (
        "out of memory" in str(exc).lower() or "can't allocate memory" in str(exc).lower()
    )
