"""``TrainConfig(compile='auto')``: compile only where the steps left pay for the compilation.

``torch.compile`` costs its compilation up front and saves a share of every later step. Whether it pays
depends on how many steps the run has left and how long one takes, so the decision is taken in the run:
after ``warmup`` eager steps (allocations, primitive caches) the next ``probe`` steps are timed, and the
model is compiled when

    steps left x median eager step x SAVING[device] > COMPILE_S[device]

The constants (``SAVING``, ``COMPILE_S``) and the rule (``pays``) are the compile component's
(``pitstop.recipes.compile``), stated, not guessed per model, from measurements
(``benchmarks/results/compile_auto.md``): on a CPU what compile saves a step depends on the model, its
sign too (the benchmark conv net +3% in bf16, +16-19% in fp32; a small transformer -3% and -21%), so the
CPU's stated saving is none and the rule keeps a CPU run eager; on CUDA (20% charged against 60 s) a 22 ms step compiles when more than
~14,000 steps are left. A run whose length is unknown (a
loader without ``len`` and no ``max_steps``) is not compiled. ``compile=True`` or ``False`` overrides the
rule; the decision and its numbers are in ``FitResult.applied['compile']``.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from pitstop.measure import clean
from pitstop.recipes.compile import COMPILE_S, SAVING, break_even_steps
from pitstop.recipes.compile import pays as rule

WARMUP_STEPS = 5
PROBE_STEPS = 20


@dataclass
class AutoCompile:
    """Times the first eager steps and decides once whether to compile (``decide`` after each step)."""

    planned: int | None  # optimizer steps the run will take in all; None when unknown
    device: str = "cpu"
    warmup: int = WARMUP_STEPS
    probe: int = PROBE_STEPS
    clock: Callable[[], float] = time.perf_counter
    decision: str | None = None  # the printed line, once decided
    compile: bool = False
    _last: float | None = None
    _times: list[float] = field(default_factory=list)
    _seen: int = 0

    @property
    def pending(self) -> bool:
        return self.decision is None

    def decide(self, step: int) -> bool | None:
        """Call after each optimizer step (``step``: steps done so far). Returns None while probing, then
        once True (compile now) or False, with ``decision`` saying why."""
        now = self.clock()
        if self._last is not None and self._seen >= self.warmup:
            self._times.append(now - self._last)
        self._last = now
        self._seen += 1
        if self.planned is None:
            return self._done(False, "off: the run's length is unknown (no len(loader), no max_steps)")
        if len(self._times) < self.probe:
            if self.planned - step <= 0:
                return self._done(False, "off: the run ended before the probe")
            return None
        step_s = statistics.median(clean(self._times).kept)
        return self._done(*rule(self.planned - step, step_s, self.device))

    def undecided(self, step: int, interrupted: bool = False) -> str:
        """``FitResult.applied['compile']`` for a run that ended before ``decide`` did (interrupted, or its
        loader yielded fewer batches than its length said): stayed eager, and why."""
        why = "interrupted" if interrupted else "the run ended"
        return f"compile auto: undecided ({why} after {step} steps, {self.warmup + self.probe} probed): eager"

    def _done(self, on: bool, why: str) -> bool:
        self.compile, self.decision = on, f"compile auto: {why}"
        return on


__all__ = ["COMPILE_S", "PROBE_STEPS", "SAVING", "WARMUP_STEPS", "AutoCompile", "break_even_steps", "rule"]
