"""The timing engine on slow steps and symmetric verdicts: budgets scaled with the step, the sequential
rule's first look, the interval from blocks of steps within runs, and ``against_bar``. Synthetic samples
from seeded generators and a fake clock: deterministic, no timing."""

from __future__ import annotations

import math
import random

import pytest

from pitstop.measure import (
    HELPED,
    NO_GAIN,
    UNDECIDED,
    Arm,
    Interval,
    Settings,
    against_bar,
    interleave,
)
from pitstop.measure.plan import budget_for_rounds
from pitstop.measure.within_runs import RUN_SPREAD, within_runs_interval


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def compared(
    means: dict[str, float], settings: Settings, seed: int, run_sd: float, step_sd: float, steps: int
):
    """Interleaved rounds of two synthetic arms (``means``: baseline first): each run ``steps`` steps of
    its mean seconds, its own speed factor of ``run_sd`` (log) and step noise of ``step_sd``; a fake
    clock advances by each run's time. Returns the candidate arm and the number of rounds."""
    rng, clock = random.Random(seed), Clock()

    def sample(name: str) -> list[float]:
        run = means[name] * math.exp(rng.gauss(0, run_sd))
        xs = [run * math.exp(rng.gauss(0, step_sd)) for _ in range(steps)]
        clock.t += sum(xs)
        return xs

    base, cand = (Arm(n) for n in means)
    n = interleave(base, [cand], sample, settings, clock=clock)
    return cand, n


def saving_verdict(iv: Interval | None, base_s: float, bar_s: float) -> str:
    """The verdict on the saving a speed-up interval means on a ``base_s`` step (as the probes give it)."""
    if iv is None or iv.rounds < 2 or iv.lo <= 0 or not math.isfinite(iv.hi):
        return against_bar(None, None, bar_s)
    return against_bar(base_s - base_s / iv.lo, base_s - base_s / iv.hi, bar_s)


def test_against_bar_is_symmetric():
    assert against_bar(0.06, 0.2, 0.05) == HELPED
    assert against_bar(-0.01, 0.04, 0.05) == NO_GAIN  # the upper bound under the bar: a pass
    assert against_bar(-0.3, -0.1, 0.05) == NO_GAIN  # slower for sure: no gain either
    assert against_bar(0.01, 0.08, 0.05) == UNDECIDED  # straddles the bar
    assert against_bar(None, None, 0.05) == UNDECIDED  # no interval is never a pass
    assert against_bar(0.0, math.inf, 0.05) == UNDECIDED


def test_budget_scales_with_the_round_and_is_capped():
    assert budget_for_rounds(0.05, 3, 6.0, 30.0) == 6.0  # quick steps: the floor
    assert budget_for_rounds(2.0, 3, 6.0, 30.0) == pytest.approx(7.5)  # 3 rounds of 2 s, 25% margin
    assert budget_for_rounds(20.0, 3, 6.0, 30.0) == 30.0  # the cap holds
    assert budget_for_rounds(math.inf, 3, 6.0, 30.0) == 6.0 and budget_for_rounds(0.0, 3, 6.0, 30.0) == 6.0


def test_large_effect_on_one_second_steps_is_decided_at_the_first_look():
    """1 s vs 0.5 s steps, 3 steps a run: the fixed 6 s budget fits one round of 4.5 s (no interval); the
    budget scaled to the round holds the 3 the sequential rule needs, and it decides there."""
    means, noise = {"fp32": 1.0, "bf16": 0.5}, {"seed": 3, "run_sd": 0.05, "step_sd": 0.03, "steps": 3}
    arm, n = compared(means, Settings(budget_s=6.0, max_rounds=10), **noise)
    assert n == 1 and arm.verdict == UNDECIDED
    assert saving_verdict(arm.interval, 1.0, 0.05) == UNDECIDED
    arm, n = compared(means, Settings(budget_s=budget_for_rounds(4.5, 3, 6.0, 60.0), max_rounds=10), **noise)
    assert arm.verdict == HELPED and arm.decided_at == 3 and n == 3
    assert saving_verdict(arm.interval, 1.0, 0.05) == HELPED


def test_null_effect_passes_only_when_the_upper_bound_is_under_the_bar():
    # steady runs: the interval is narrow and its upper bound under 5% of the step -> a pass
    same = {"a": 0.1, "b": 0.1}
    arm, _ = compared(
        same, Settings(budget_s=math.inf, max_rounds=8), 5, run_sd=0.005, step_sd=0.02, steps=20
    )
    assert saving_verdict(arm.interval, 0.1, 0.005) == NO_GAIN
    # the same null effect on a loaded machine (runs 30% apart), 3 rounds: undecided, never a pass
    arm, _ = compared(same, Settings.every_round(3), 5, run_sd=0.3, step_sd=0.05, steps=20)
    assert arm.verdict == UNDECIDED
    assert saving_verdict(arm.interval, 0.1, 0.005) == UNDECIDED


def test_noisy_effect_is_left_undecided():
    arm, _ = compared(
        {"a": 0.1, "b": 0.09},
        Settings(budget_s=math.inf, max_rounds=4),
        9,
        run_sd=0.25,
        step_sd=0.1,
        steps=10,
    )
    assert arm.verdict == UNDECIDED
    assert saving_verdict(arm.interval, 0.1, 0.005) == UNDECIDED


def one_round(base_s: float, cand_s: float, steps: int, step_sd: float, seed: int):
    rng = random.Random(seed)
    b = [base_s * math.exp(rng.gauss(0, step_sd)) for _ in range(steps)]
    c = [cand_s * math.exp(rng.gauss(0, step_sd)) for _ in range(steps)]
    return [b], [c]


def test_blocks_within_one_round_decide_a_large_effect():
    iv = within_runs_interval(*one_round(1.0, 0.5, 6, 0.05, seed=1))
    assert iv is not None and iv.method == "blocks" and iv.rounds == 1 and iv.steps_base == 6
    assert 1.05 < iv.lo < 2.0 < iv.hi and "blocks within runs" in iv.text()


def test_blocks_within_runs_keep_the_run_allowance_and_leave_small_effects_open():
    # no step noise at all: the width is the allowance for each run's own speed, not zero
    one = within_runs_interval([[1.0] * 6], [[0.9] * 6])
    assert one is not None and one.lo < 1.0 < 1 / 0.9 < one.hi
    assert math.log(one.hi / one.estimate) == pytest.approx(1.972 * math.sqrt(2) * RUN_SPREAD, rel=1e-3)
    # more rounds shrink the allowance
    two = within_runs_interval([[1.0] * 6, [1.0] * 6], [[0.9] * 6, [0.9] * 6])
    assert two is not None and two.hi < one.hi
    # a null effect with noisy steps: contains 1
    iv = within_runs_interval(*one_round(1.0, 1.0, 12, 0.1, seed=4))
    assert iv is not None and iv.lo < 1.0 < iv.hi
    # fewer than two blocks: no interval
    assert within_runs_interval([[1.0, 1.0]], [[0.5, 0.5]]) is None
    assert within_runs_interval([[1.0] * 4], [[0.5] * 4]) is None
