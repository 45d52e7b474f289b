"""Measurements the bench rows are built from: the machine's matmul peak (``pitstop.matmul``, bounded in
time), model FLOPs per sample, and peak memory of one training step. Each is measured in the run that
reports it."""

from __future__ import annotations

import bisect
import contextlib
import itertools
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from pitstop.bench.workloads import Workload
from pitstop.matmul import Peak, matmul_peak  # noqa: F401  (bench's peaks: one bounded implementation)


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
