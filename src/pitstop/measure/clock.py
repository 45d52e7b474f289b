"""The clock of pitstop's in-process timings: a ``Stopwatch`` on ``time.perf_counter`` that can leave
stretches out (an epoch's restart inside a throughput window); ``time_block``, the mean time of a
call over a block of calls timed together (bench's blocks of training steps); and ``time_calls``, the
time of each of a series of calls timed alone (the profile probes' passes and steps).

What a timing is made of stays with its caller (a DataLoader window, a training step, a worker restart);
the reading of the clock is here, so every in-process timer reads the same one and a test can give it
its own (``clock``). Samples go on to ``pitstop.measure`` (rounds, intervals, verdicts) and
``pitstop.measure.throughput`` (rates over windows).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field


@dataclass
class Stopwatch:
    """Seconds since it was made, less those spent under ``paused()``."""

    clock: Callable[[], float] = time.perf_counter
    started: float = field(init=False)
    paused_s: float = field(init=False, default=0.0)

    def __post_init__(self) -> None:
        self.started = self.clock()

    def elapsed(self) -> float:
        return self.clock() - self.started - self.paused_s

    @contextmanager
    def paused(self) -> Iterator[None]:
        """A stretch that does not count (also when it raises)."""
        t0 = self.clock()
        try:
            yield
        finally:
            self.paused_s += self.clock() - t0


def time_block(
    fn: Callable[[], object],
    steps: int,
    sync: Callable[[], object] | None = None,
    warmup: int = 0,
    clock: Callable[[], float] = time.perf_counter,
) -> float:
    """Mean seconds per call over ``steps`` calls of ``fn`` timed as one block, after ``warmup`` untimed
    calls (torch.utils.benchmark's recipe). ``sync`` (a device synchronize) runs at both ends of the
    timed region, so queued device work is counted in the block it belongs to."""
    for _ in range(warmup):
        fn()
    if sync is not None:
        sync()
    watch = Stopwatch(clock)
    for _ in range(steps):
        fn()
    if sync is not None:
        sync()
    return watch.elapsed() / max(steps, 1)


def time_calls(
    fn: Callable[[], object],
    calls: int,
    sync: Callable[[], object] | None = None,
    *,
    budget_s: float = math.inf,
    min_calls: int = 1,
    between: Callable[[], object] | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> list[float]:
    """Seconds of each of up to ``calls`` calls of ``fn``, each timed alone between two ``sync`` calls
    (``time_block`` of one call), so one sample is one call. ``between`` runs after each call, outside its
    time (a reading taken between passes). The series ends early once ``min_calls`` are in and
    ``budget_s`` seconds (``between`` included) have passed since it began."""
    watch, out = Stopwatch(clock), []
    for _ in range(calls):
        out.append(time_block(fn, 1, sync, clock=clock))
        if between is not None:
            between()
        if len(out) >= min_calls and watch.elapsed() > budget_s:
            break
    return out


__all__ = ["Stopwatch", "time_block", "time_calls"]
