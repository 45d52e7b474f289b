"""Measurements the bench rows are built from: the machine's matmul peak, model FLOPs per sample, and
peak memory of one training step. Each is measured in the run that reports it."""

from __future__ import annotations

import bisect
import contextlib
import itertools
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from pitstop.bench.workloads import Workload


@dataclass
class Peak:
    dtype: str
    n: int  # the matrix size that was fastest
    flops_per_s: float
    seconds: float  # fastest time of one torch.mm at that size


def matmul_peak(
    dtype: str, device: str = "cpu", sizes: tuple[int, ...] | None = None, min_run_time: float = 0.3
) -> Peak:
    """FLOP/s of square ``torch.mm``: the practical compute ceiling. A ceiling, so the fastest block over
    a few sizes counts (other load on the machine only ever makes a block slower)."""
    from torch.utils.benchmark import Timer

    sizes = sizes or ((4096, 8192) if device == "cuda" else (1024, 2048))
    dt = getattr(torch, dtype)
    best: Peak | None = None
    for n in sizes:
        a = torch.randn(n, n, device=device).to(dt)
        b = torch.randn(n, n, device=device).to(dt)
        torch.mm(a, b)  # warm-up (oneDNN / cuBLAS kernel selection)
        timer = Timer(
            "torch.mm(a, b)", globals={"torch": torch, "a": a, "b": b}, num_threads=torch.get_num_threads()
        )
        m = timer.blocked_autorange(min_run_time=min_run_time)
        t = min(m.times)
        if best is None or 2 * n**3 / t > best.flops_per_s:
            best = Peak(dtype, n, 2 * n**3 / t, t)
    assert best is not None
    return best


def flops_per_sample(workload: Workload, device: str = "cpu") -> float:
    """Model FLOPs of one forward + backward, per sample, counted once with FlopCounterMode (fp32 model)."""
    from torch.utils.flop_counter import FlopCounterMode

    model = workload.make_model().to(device)
    x, y = workload.example_batch()
    x, y = x.to(device), y.to(device)
    counter = FlopCounterMode(display=False)
    with counter:
        workload.loss(model(x), y).backward()
    return counter.get_total_flops() / x.shape[0]


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """Kineto logs its start/stop lines straight to fd 2; keep them out of the terminal table."""
    try:
        saved = os.dup(2)
    except OSError:
        yield
        return
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


@dataclass
class StepMemory:
    peak_bytes: int  # most bytes live at once during the step, above what was live before it
    activation_bytes: int | None  # bytes a forward pass leaves live (held for backward); max over passes


def step_memory(step: Callable[[], None], device: str = "cpu") -> StepMemory:
    """Memory of one call of ``step``, from the profiler's allocation events replayed in time order.

    CPU keeps no allocator statistics, so the peak is replayed from the events; on CUDA the caching
    allocator's peak is used. Parameters and optimizer
    state that exist before the step are not counted; activations, gradients and temporaries are.
    Activation bytes: growth of live memory over each ``FORWARD_MARK`` range (the largest, for accumulation).
    """
    from torch.profiler import ProfilerActivity, profile

    from pitstop.bench.session import FORWARD_MARK

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    want = torch.autograd.DeviceType.CUDA if device == "cuda" else torch.autograd.DeviceType.CPU
    if device == "cuda":
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    with _quiet_stderr(), profile(activities=acts, profile_memory=True) as prof:
        step()
        if device == "cuda":
            torch.cuda.synchronize()
    events = prof.profiler.kineto_results.events()
    mem = sorted(
        (e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]" and e.device_type() == want
    )
    ranges = [(e.start_ns(), e.start_ns() + e.duration_ns()) for e in events if e.name() == FORWARD_MARK]
    times = [ts for ts, _ in mem]
    live_after = list(itertools.accumulate(n for _, n in mem))

    def live_at(t: int) -> int:  # bytes live just before time t (allocations at or after t not yet made)
        i = bisect.bisect_left(times, t)
        return live_after[i - 1] if i else 0

    peak = max(live_after, default=0)
    if device == "cuda":  # the caching allocator's own peak is exact there
        peak = torch.cuda.max_memory_allocated() - base
    grown = [live_at(end) - live_at(start) for start, end in ranges]
    return StepMemory(int(max(0, peak)), max(grown) if grown else None)
