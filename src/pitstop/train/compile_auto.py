"""``TrainConfig(compile='auto')``: compile where it measures faster and the steps left pay for it.

``torch.compile`` costs its compilation up front and saves a share of every later step, or loses one: on
a CPU the sign depends on the model (``benchmarks/results/compile_auto.md``: the benchmark conv net +3%
in bf16, +16-19% in fp32; a small transformer -3% and -21%). So the decision is taken in the run, in
three stages, all on real training steps (nothing is thrown away):

1. **Probe**: after ``warmup`` eager steps (allocations, primitive caches) the next ``probe`` steps are
   timed; their median is the eager step.
2. **Trial** (a CPU, ``TRIAL_DEVICES``), started only where the steps left could pay for it (steps left x
   eager step x ``TRIAL_MIN_SAVING`` > ``COMPILE_S``: a trial that finds no gain has spent its
   compilation, at most 5% of the run): the model is compiled (the compile component's ``wrap``, with its
   fallback); the first compiled step's time over an eager step is the compilation. Then blocks of eager
   and compiled steps alternate, the order rotated every round (``pitstop.measure``'s ``Arm``,
   ``rotated``), both modules sharing the parameters and the optimizer. After each round from the third,
   the interval of the speed-up over rounds (``judge_rounds``: ``speedup_interval`` and ``decide``, 5%
   margin) may decide; the trial is bounded to ``TRIAL_S`` seconds of steps (or ``MIN_ROUNDS`` rounds
   where those take longer), ``TRIAL_ROUNDS`` rounds and ``TRIAL_SHARE`` of the steps left.
3. **Decision**: compiled is kept only where the trial's verdict is *helped* and the measured saving a step
   x steps left pays back the measured compilation (spent by then, it stands for the recompilations a
   run may still meet, e.g. at an epoch's short last batch); otherwise the run goes back to eager, saying
   why.

On CUDA the stated rule (``pays``: 20% against 60 s) decides after the probe: its steps are queued, and the
loop never syncs to time them. A run whose length is unknown (a loader without ``len`` and no
``max_steps``) is not compiled. ``compile=True`` or ``False`` overrides all of this; the decision and its
numbers are in ``FitResult.applied['compile']``.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from pitstop.measure import HELPED, UNDECIDED, Arm, Interval, Settings, clean, judge_rounds, rotated
from pitstop.recipes.compile import (
    COMPILE_S,
    SAVING,
    TRIAL_DEVICES,
    TRIAL_MIN_SAVING,
    break_even_steps,
    worth_a_trial,
)
from pitstop.recipes.compile import pays as rule

WARMUP_STEPS = 5
PROBE_STEPS = 20
EAGER, COMPILED = "eager", "compiled"
# The trial's bounds: up to half a minute of steps, a small share of the run (a trial starts only in a run
# of 20 minutes or more: ``worth_a_trial``), and it ends as soon as its interval decides. Every trial step
# trains, so a long trial costs only the compiled blocks' loss where compile is slower; a short one cannot
# tell a 5-10% gain from the rounds' noise (12 rounds on the benchmark net: 1.01x, 0.97-1.06, where a
# side-by-side run measured compiled 1.07x). A round is one block of each arm; 3 rounds are the fewest an
# interval decides on (``Settings.min_rounds``).
TRIAL_S = 30.0  # eager seconds of steps the trial may take (more only where MIN_ROUNDS need them)
TRIAL_SHARE = 0.05  # of the steps left, at most
TRIAL_ROUNDS = 60
MIN_ROUNDS = 3
BLOCK_STEPS = 5  # steps of one arm in a row; fewer (down to 2) where steps are slow


def plan_trial(steps_left: int, step_s: float) -> tuple[int, int] | None:
    """(steps per block, rounds at most) for a trial of eager steps of ``step_s`` seconds within the
    bounds above; None where not even ``MIN_ROUNDS`` rounds fit ``TRIAL_SHARE`` of ``steps_left``."""
    step_s = max(step_s, 1e-9)
    block = max(2, min(BLOCK_STEPS, int(TRIAL_S / (2 * MIN_ROUNDS * step_s))))
    by_time = max(MIN_ROUNDS, int(TRIAL_S / (2 * block * step_s)))
    rounds = min(TRIAL_ROUNDS, by_time, int(TRIAL_SHARE * steps_left / (2 * block)))
    return (block, rounds) if rounds >= MIN_ROUNDS else None


@dataclass
class Trial:
    """Blocks of eager and compiled steps, one of each a round in rotated order, and their verdict."""

    block: int  # steps per block
    rounds: int  # at most
    eager: Arm = field(default_factory=lambda: Arm(EAGER))
    compiled: Arm = field(default_factory=lambda: Arm(COMPILED))
    interval: Interval | None = None  # compiled's speed-up over eager, as of the last round
    _steps: list[float] = field(default_factory=list)  # the running block's

    @property
    def settings(self) -> Settings:
        return Settings(min_rounds=MIN_ROUNDS, max_rounds=self.rounds, min_gain=TRIAL_MIN_SAVING)

    def arm(self) -> str:
        """The arm the next step runs."""
        r = min(len(self.eager.rounds), len(self.compiled.rounds))
        order = rotated([EAGER, COMPILED], r)
        return order[1] if len(self.eager.rounds) != len(self.compiled.rounds) else order[0]

    def add(self, step_s: float) -> str | None:
        """Record one step of ``arm()``; the verdict once the rounds allow one or are spent (helped, hurt,
        no change or undecided), else None."""
        self._steps.append(step_s)
        if len(self._steps) < self.block:
            return None
        (self.eager if self.arm() == EAGER else self.compiled).add(self._steps)
        self._steps = []
        n = len(self.compiled.rounds)
        if n != len(self.eager.rounds):
            return None  # the round's second block is next
        self.interval, verdict = judge_rounds(
            self.eager.rounds, self.compiled.rounds, self.settings, final=n >= self.rounds
        )
        return verdict or (UNDECIDED if n >= self.rounds else None)

    def median_s(self, arm: Arm) -> float:
        return statistics.median([s for r in arm.rounds for s in r])


@dataclass
class AutoCompile:
    """Times the first eager steps, then (a CPU) runs the trial, and decides once whether to compile
    (``decide`` after each step says which model the next step runs)."""

    planned: int | None  # optimizer steps the run will take in all; None when unknown
    device: str = "cpu"
    warmup: int = WARMUP_STEPS
    probe: int = PROBE_STEPS
    clock: Callable[[], float] = time.perf_counter
    decision: str | None = None  # the printed line, once decided
    compile: bool = False  # the model kept, once decided
    eager_s: float | None = None  # the probe's median eager step
    compile_s: float | None = None  # the first compiled step's time over an eager step
    trial: Trial | None = None
    started: str | None = None  # why the trial started (printed as it compiles)
    _last: float | None = None
    _times: list[float] = field(default_factory=list)
    _seen: int = 0

    @property
    def pending(self) -> bool:
        return self.decision is None

    def decide(self, step: int, failed: BaseException | None = None) -> bool | None:
        """Call after each optimizer step (``step``: steps done so far; ``failed``: the error the compiled
        model fell back to eager on, if any). Returns the model the next step runs: True compiled, False
        eager, None the same as this one (probing). ``decision`` says why once decided, and ``compile``
        is then the model kept."""
        now = self.clock()
        dt = None if self._last is None else now - self._last
        self._last = now
        if self.trial is not None:
            if failed is not None:
                return self._done(False, f"off: compilation failed ({type(failed).__name__}: {failed})")
            return self._trial_step(step, dt or 0.0)
        if dt is not None and self._seen >= self.warmup:
            self._times.append(dt)
        self._seen += 1
        if self.planned is None:
            return self._done(False, "off: the run's length is unknown (no len(loader), no max_steps)")
        if len(self._times) < self.probe:
            if self.planned - step <= 0:
                return self._done(False, "off: the run ended before the probe")
            return None
        self.eager_s = statistics.median(clean(self._times).kept)
        left = self.planned - step
        if self.device not in TRIAL_DEVICES:
            return self._done(*rule(left, self.eager_s, self.device))
        return self._start(left)

    def undecided(self, step: int, interrupted: bool = False) -> str:
        """``FitResult.applied['compile']`` for a run that ended before ``decide`` did (interrupted, or its
        loader yielded fewer batches than its length said): stayed eager, and why."""
        why = "interrupted" if interrupted else "the run ended"
        during = ", during the trial" if self.trial is not None else ""
        return f"compile auto: undecided ({why} after {step} steps{during}, {self.warmup + self.probe} probed): eager"

    def _start(self, left: int) -> bool:
        """After the probe: compile for a trial (True) where the steps left could pay, else stay eager."""
        assert self.eager_s is not None
        worth, why = worth_a_trial(left, self.eager_s, self.device)
        if not worth:
            return self._done(False, why)
        plan = plan_trial(left, self.eager_s)
        if plan is None:
            return self._done(False, f"off: no trial: {left:,} steps left hold no {MIN_ROUNDS} rounds")
        self.trial = Trial(*plan)
        self.started = f"compile auto: {why}; compiling"
        return True

    def _trial_step(self, step: int, dt: float) -> bool:
        """One step of the trial: the first is the compilation's, then the blocks'."""
        assert self.trial is not None and self.eager_s is not None
        if self.compile_s is None:
            self.compile_s = max(0.0, dt - self.eager_s)
            return self.trial.arm() == COMPILED
        verdict = self.trial.add(dt)
        if verdict is None:
            return self.trial.arm() == COMPILED
        return self._judge(verdict, max(0, (self.planned or step) - step))

    def _judge(self, verdict: str, left: int) -> bool:
        """Keep compiled where the trial says helped and the saving over ``left`` steps pays back the
        compilation; the line states the measured numbers either way."""
        t, cost = self.trial, self.compile_s
        assert t is not None and cost is not None
        eager_s, iv = t.median_s(t.eager), t.interval
        speedup = iv.estimate if iv is not None else 1.0
        saving_s = eager_s * (1 - 1 / speedup)  # a step, by the interval's estimate
        even = int(cost / saving_s) + 1 if saving_s > 0 else None
        # compiled's step by the same estimate as the speed-up, so the two numbers and the ratio agree
        numbers = (
            f"eager {1000 * eager_s:.1f} ms vs compiled {1000 * eager_s / speedup:.1f} ms a step, "
            f"{iv.text() if iv is not None else 'no interval'}; compilation {cost:.1f} s; "
            f"break-even {f'{even:,} steps' if even else 'never'}, {left:,} steps left"
        )
        if verdict != HELPED:
            return self._done(False, f"off: trial {verdict}: {numbers}: back to eager")
        if even is None or even > left:
            return self._done(False, f"off: trial helped but too few steps left: {numbers}: back to eager")
        return self._done(True, f"on: trial helped: {numbers}")

    def _done(self, on: bool, why: str) -> bool:
        self.compile, self.decision = on, f"compile auto: {why}"
        return on


__all__ = [
    "COMPILE_S",
    "PROBE_STEPS",
    "SAVING",
    "TRIAL_MIN_SAVING",
    "WARMUP_STEPS",
    "AutoCompile",
    "Trial",
    "break_even_steps",
    "plan_trial",
    "rule",
    "worth_a_trial",
]
