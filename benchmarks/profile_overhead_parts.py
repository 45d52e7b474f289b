"""The decomposition behind ``profile_overhead.py``'s bound: (a) the instruments' cost a step inside the
script's thread, from blocks of steps with them on and off in one process; (b) pitstop's CPU outside the
script's thread (the parent process and the child's other threads) while the script's window ran.

(a) ``toggled_blocks``: the example runs once, in this process (runpy), with ``Optimizer.zero_grad``
wrapped: every example calls it once a step between its forward and backward, where no pitstop phase is
open and no hook table is being walked, so ``Instrumentation.uninstall``/``install`` can switch the
instruments there. After a lead-in with them on (pitstop's warm-up and its hooks' narrowing), blocks
alternate on/off, the order rotated every pair, so drift of the machine falls on both sides of a pair.

(b) ``CpuSampler``: a thread that reads the CPU time of this process (``getrusage``, where
``pitstop.profile.runs.runner.run`` supervises the child) less its own thread's, and of each of the
child's threads (``/proc/<pid>/task/<tid>/schedstat``, ns: ``/proc/<pid>/stat`` counts 10 ms ticks).
"""

from __future__ import annotations

import math
import os
import resource
import statistics
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ON, OFF = "on", "off"
SPIKE = 2.0  # a step this many times the run's median step is counted as a spike (a preemption, mostly)


def mean_interval(xs: list[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """(mean, low, high): Student t interval of the mean (unbounded with fewer than 2 values)."""
    from pitstop.measure import t_quantile

    if not xs:
        return math.nan, -math.inf, math.inf
    m = statistics.fmean(xs)
    if len(xs) < 2:
        return m, -math.inf, math.inf
    half = t_quantile(confidence, len(xs) - 1) * statistics.stdev(xs) / math.sqrt(len(xs))
    return m, m - half, m + half


# ------------------------------------------------------------------------------------------- (a)


@dataclass
class BlockCost:
    """Mean seconds a step of each block, on and off, block ``p`` of each from pair ``p``."""

    name: str
    block: int  # steps a block
    dropped: int  # steps left out at the start of every block (the switch's step)
    on: list[float] = field(default_factory=list)
    off: list[float] = field(default_factory=list)
    # steps over SPIKE x the median step, per arm: kept in the means (one may be pitstop's work: a flush
    # on a loaded machine), counted so that an arm with many more shows
    spikes: dict[str, int] = field(default_factory=lambda: {ON: 0, OFF: 0})

    def step_s(self) -> float:
        """The off blocks' median step (the script's step without the instruments, in this process)."""
        return statistics.median(self.off) if self.off else math.nan

    def cost_us(self) -> tuple[float, float, float]:
        """Instruments' cost a step in microseconds: mean of the pairs' on - off, with its interval."""
        return mean_interval([1e6 * (a - b) for a, b in zip(self.on, self.off, strict=False)])

    def share(self) -> tuple[float, float, float]:
        """The same as a share of the step: mean of the pairs' on / off - 1, with its interval."""
        return mean_interval([a / b - 1 for a, b in zip(self.on, self.off, strict=False) if b > 0])


class _Switch:
    """``Optimizer.zero_grad``'s wrapper: the time a step, the instruments switched and torch's random
    numbers re-seeded at block starts."""

    def __init__(self, inst: Any, plan: list[str], lead: int, block: int, install: Any) -> None:
        import torch

        from pitstop.measure.clock import Stopwatch

        self.seed = torch.manual_seed
        self.inst, self.plan, self.lead, self.block, self.install = inst, plan, lead, block, install
        self.watch = Stopwatch()
        # each call's time on entry and after a switch: a step runs from one call's exit to the next's
        # entry, so the switch's own time is in no step
        self.entered: list[float] = []
        self.left: list[float] = []
        self.installed = True
        self.off_since = 0.0

    def __call__(self) -> None:
        self.entered.append(self.watch.elapsed())
        i = len(self.left) - self.lead
        if i >= 0 and i % self.block == 0:
            k = i // self.block
            self.set(k < len(self.plan) and self.plan[k] == ON)
            # both blocks of a pair draw the same random numbers (batches, augmentations: slow_loader's
            # decoding and cropping vary with them), so a pair's blocks do the same work
            self.seed(k // 2)
        self.left.append(self.watch.elapsed())

    def steps(self) -> list[float]:
        return [b - a for a, b in zip(self.left, self.entered[1:], strict=False)]

    def set(self, on: bool) -> None:
        if on == self.installed:
            return
        from pitstop.profile.capture import hooks

        inst = self.inst
        if on:
            self.install(inst)
            inst.models.narrowed = False  # its hooks narrow again at the next optimizer step, as in a run
            # the periodic flush counts the time the instruments were on, so it comes as often as in a run
            inst._last_flush += hooks.clock() - self.off_since
        else:
            inst.uninstall()
            inst.clock.step_start = None  # the step in progress is not measured (as ``detach``)
            self.off_since = hooks.clock()
        self.installed = on


def toggled_blocks(
    script: Path,
    args: list[str],
    name: str,
    block: int,
    pairs: int,
    tmp: Path,
    lead: int = 24,
    drop: int = 1,
    install: Any = None,
) -> BlockCost:
    """Run ``script`` once in this process with ``args`` (which must give it ``lead + 2 * pairs * block``
    steps or more), the instruments on for ``lead`` steps, then ``pairs`` pairs of blocks on/off.
    ``install(inst)`` puts them on (default ``Instrumentation.install``: all of them; one part of it, for
    ``profile_overhead_part_blocks.py``); off is always ``uninstall``, which undoes whatever was put on."""
    import contextlib
    import io
    import runpy
    import sys

    import torch

    from pitstop.measure import rotated
    from pitstop.profile.capture.hooks import Config, Instrumentation

    plan = [arm for p in range(pairs) for arm in rotated([ON, OFF], p)]
    inst = Instrumentation(Config(full=True, warmup=5, out_dir=tmp, probes=False))
    inst.flush_path = tmp / "measurements.json"  # the periodic flush is the script thread's work too
    install = install or Instrumentation.install
    switch = _Switch(inst, plan, lead, block, install)
    orig = torch.optim.Optimizer.zero_grad

    def zero_grad(self: Any, *a: Any, **kw: Any) -> Any:
        switch()
        return orig(self, *a, **kw)

    argv, sys.argv = sys.argv, [str(script), *args]
    torch.optim.Optimizer.zero_grad = zero_grad  # type: ignore[method-assign]
    install(inst)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            runpy.run_path(str(script), run_name="__main__")
    finally:
        switch.set(False)
        torch.optim.Optimizer.zero_grad = orig  # type: ignore[method-assign]
        sys.argv = argv
    return _blocks(name, switch.steps(), plan, lead, block, drop)


def _blocks(name: str, steps: list[float], plan: list[str], lead: int, block: int, drop: int) -> BlockCost:
    """Mean step of each block (its first ``drop`` steps left out); pairs with both blocks whole."""
    out = BlockCost(name, block, drop)
    timed = steps[lead : lead + len(plan) * block]
    spike = SPIKE * statistics.median(timed) if timed else math.inf
    for p in range(len(plan) // 2):
        means = {}
        for j in (2 * p, 2 * p + 1):
            span = steps[lead + j * block + drop : lead + (j + 1) * block]
            if len(span) < block - drop:
                return out  # the script ended before this pair did
            out.spikes[plan[j]] += sum(x > spike for x in span)
            means[plan[j]] = statistics.fmean(span)
        out.on.append(means[ON])
        out.off.append(means[OFF])
    return out


# ------------------------------------------------------------------------------------------- (b)


def _thread_cpu_s(pid: int) -> dict[int, float]:
    """CPU seconds of each live thread of ``pid``."""
    out: dict[int, float] = {}
    base = f"/proc/{pid}/task"
    try:
        tids = os.listdir(base)
    except OSError:
        return out
    for t in tids:
        tid = int(t)
        try:
            with open(f"{base}/{t}/schedstat") as f:
                out[tid] = int(f.read().split()[0]) / 1e9
        except (OSError, ValueError, IndexError):
            continue  # ended since the listing
    return out


@dataclass
class Sample:
    t: float  # seconds on the sampler's stopwatch
    parent_s: float  # this process (its ended threads too) but the sampler's thread
    main_s: float  # the child's main thread (the script)
    other_s: dict[int, float]  # the child's other live threads, by thread id


class CpuSampler:
    """Samples every ``every_s`` while a run goes (``with CpuSampler() as s: run()``); the child is this
    process's first child process seen."""

    def __init__(self, every_s: float = 0.05) -> None:
        self.every_s = every_s
        self.samples: list[Sample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> CpuSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        import psutil

        from pitstop.measure.clock import Stopwatch

        watch, child = Stopwatch(), None
        while not self._stop.is_set():
            if child is None:
                kids = psutil.Process().children()
                child = kids[0].pid if kids else None
            if child is not None:
                threads = _thread_cpu_s(child)
                if threads:
                    own = resource.getrusage(resource.RUSAGE_SELF)
                    parent = own.ru_utime + own.ru_stime - time.thread_time()
                    self.samples.append(Sample(watch.elapsed(), parent, threads.pop(child, 0.0), threads))
            self._stop.wait(self.every_s)

    def window(self, window_s: float) -> tuple[float, float] | None:
        """(parent CPU s, child's other threads' CPU s) over the last ``window_s`` seconds the child was
        seen alive (the script's window ends at its last step, shortly before it exits); None when the
        samples do not span the window."""
        if len(self.samples) < 2:
            return None
        end = self.samples[-1]
        first = next(
            (i for i in range(len(self.samples) - 1, -1, -1) if self.samples[i].t <= end.t - window_s), None
        )
        if first is None:
            return None
        start = self.samples[first]
        last: dict[int, float] = {}  # each thread's CPU when last seen (a thread may end in the window)
        for s in self.samples[first:]:
            last.update(s.other_s)
        other = sum(v - start.other_s.get(tid, 0.0) for tid, v in last.items())
        scale = window_s / (end.t - start.t)  # the sampled span is up to one interval longer
        return scale * (end.parent_s - start.parent_s), scale * other
