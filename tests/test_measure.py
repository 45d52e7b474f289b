"""The timing engine on synthetic samples (deterministic: seeded generators, no clocks)."""

from __future__ import annotations

import math
import random

import pytest

from pitstop.measure import (
    HELPED,
    HURT,
    NO_CHANGE,
    UNDECIDED,
    Arm,
    Interval,
    Settings,
    blocks,
    clean,
    decide,
    format_interval,
    interleave,
    rotated,
    speedup_interval,
    t_quantile,
)
from pitstop.measure.plan import log_spread, steps_for_startup


def noisy(mean: float, n: int, rng: random.Random, sd: float = 0.02) -> list[float]:
    return [mean * math.exp(rng.gauss(0, sd)) for _ in range(n)]


# ------------------------------------------------------------------------------------------- outliers


def test_clean_drops_warmup_and_slow_spikes_only():
    rng = random.Random(1)
    run = noisy(0.1, 40, rng)
    run[0] = 0.9  # first batch after the worker pool starts (inside the warm-up)
    run[20] = 0.5  # epoch boundary
    run[30] = 0.3  # eval
    run[10] = 0.05  # a fast step is never an outlier
    c = clean(run, warmup=2)
    whys = [(o.index, o.why) for o in c.outliers]
    assert whys == [(0, "warm-up"), (1, "warm-up"), (20, "spike"), (30, "spike")]
    assert 0.05 in c.kept and len(c.kept) == 36
    assert c.threshold is not None and 0.1 < c.threshold < 0.3


def test_clean_survives_many_spikes_and_constant_runs():
    # up to almost half the steps can be spikes: the median and MAD come from the rest
    run = [0.1] * 11 + [1.0] * 9
    c = clean(run)
    assert c.kept == [0.1] * 11 and len(c.outliers) == 9
    # identical steps: nothing dropped (no division by a zero MAD)
    assert clean([0.2] * 10).kept == [0.2] * 10
    # too few to tell: kept, no threshold
    assert clean([0.1, 5.0]).threshold is None and clean([0.1, 5.0]).kept == [0.1, 5.0]
    # non-finite and non-positive values are not samples
    assert clean([0.1, math.nan, -1.0, 0.1, 0.1]).kept == [0.1, 0.1, 0.1]


def test_normal_noise_loses_almost_nothing():
    rng = random.Random(7)
    run = [rng.gauss(0.1, 0.005) for _ in range(5000)]
    assert len(clean(run).outliers) <= 2


# ------------------------------------------------------------------------------------------- interval


def test_t_quantile_matches_tables():
    # Student t two-sided 95% critical values (standard tables)
    for df, t in ((1, 12.706), (2, 4.303), (4, 2.776), (9, 2.262), (30, 2.042)):
        assert t_quantile(0.95, df) == pytest.approx(t, abs=1e-3)
    assert t_quantile(0.90, 5) == pytest.approx(2.015, abs=1e-3)


def test_t_quantile_without_degrees_of_freedom_is_infinite():
    assert t_quantile(0.95, 0) == math.inf and t_quantile(0.95, -1) == math.inf


def test_interval_of_a_planted_speedup_contains_it_and_narrows_with_rounds():
    rng = random.Random(3)
    base = [noisy(0.12, 20, rng) for _ in range(8)]
    cand = [noisy(0.10, 20, rng) for _ in range(8)]
    iv3 = speedup_interval(base[:3], cand[:3])
    iv8 = speedup_interval(base, cand)
    assert iv3 and iv8
    assert iv8.lo < iv8.estimate < iv8.hi and iv8.estimate == pytest.approx(1.2, rel=0.02)
    assert iv8.lo > 1.15 and iv8.hi < 1.25
    assert (iv8.hi - iv8.lo) < (iv3.hi - iv3.lo)
    assert (iv8.rounds, iv8.steps_base, iv8.steps_cand) == (8, 160, 160)
    assert speedup_interval(base, cand) == iv8  # a pure function of the samples


def test_interval_sees_run_to_run_spread():
    """Steps inside a run agree, runs differ by 15%: the interval must be wide (the runs are the unit)."""
    rng = random.Random(5)
    base, cand = [], []
    for _ in range(4):
        base.append(noisy(0.1 * math.exp(rng.gauss(0, 0.15)), 30, rng, sd=0.001))
        cand.append(noisy(0.1 * math.exp(rng.gauss(0, 0.15)), 30, rng, sd=0.001))
    iv = speedup_interval(base, cand)
    assert iv.lo < 1.0 < iv.hi and iv.hi - iv.lo > 0.2


def test_interval_edge_cases():
    assert speedup_interval([[]], [[0.1]]) is None
    one = speedup_interval([[0.2, 0.2]], [[0.1, 0.1]])
    assert one.estimate == pytest.approx(2.0) and math.isinf(one.hi) and decide(one, 0.05, 1) is None
    # a failed round on either side is left out of the pairing
    iv = speedup_interval([[0.2], [], [0.2]], [[0.1], [0.1], [0.1]])
    assert iv.rounds == 2 and iv.lo == iv.hi == pytest.approx(2.0)


def test_format():
    iv = Interval(1.2, 1.12, 1.28, 6, 180, 180)
    assert format_interval(iv) == "1.20x (95% CI 1.12\u20131.28, 6 rounds, 180 steps each side)"
    assert iv.text() == format_interval(iv)
    assert "119 vs 120 steps" in Interval(1.0, 0.9, 1.1, 1 + 5, 120, 119).text()
    assert "no interval from 1 round" in Interval(1.0, 0.0, math.inf, 1, 20, 20).text()


# ------------------------------------------------------------------------------------------- decisions


@pytest.mark.parametrize(
    ("lo", "hi", "rounds", "verdict"),
    [
        (1.06, 1.3, 3, HELPED),
        (1.04, 1.3, 3, None),  # above 1 but not above 1 + min_gain: keep measuring
        (0.7, 0.99, 3, HURT),
        (0.96, 1.04, 3, NO_CHANGE),
        (0.94, 1.04, 3, None),
        (1.06, 1.3, 2, None),  # before min_rounds nothing is decided
    ],
)
def test_decide(lo, hi, rounds, verdict):
    assert decide(Interval((lo + hi) / 2, lo, hi, rounds, 1, 1), min_gain=0.05, min_rounds=3) == verdict


def test_hurt_reads_the_wider_interval():
    iv = Interval(0.95, 0.91, 0.99, 4, 1, 1)
    assert decide(iv, 0.05, 3) == HURT
    assert decide(iv, 0.05, 3, hurt_iv=Interval(0.95, 0.88, 1.02, 4, 1, 1)) is None
    assert decide(iv, 0.05, 3, hurt_iv=Interval(0.95, 0.88, 0.995, 4, 1, 1)) == HURT


def test_hurt_confidence_keeps_an_aa_pair_from_being_called_hurt():
    # the same log ratios: below 1 at 95%, not at 99%
    base = [[1.0] * 5 for _ in range(4)]
    cand = [[v] * 5 for v in (1.02, 1.05, 1.01, 1.04)]
    iv95 = speedup_interval(base, cand, 0.95)
    assert iv95.hi < 1 and speedup_interval(base, cand, 0.99).hi > 1
    arm, b = Arm("x", rounds=cand), Arm("b", rounds=base)
    from pitstop.measure import update_verdicts

    update_verdicts(b, [arm], Settings(hurt_confidence=0.95), 4)
    assert arm.verdict == HURT
    arm2 = Arm("y", rounds=cand)
    update_verdicts(b, [arm2], Settings(), 4)
    assert arm2.verdict is None and arm2.interval.hi == pytest.approx(iv95.hi)


def test_steps_for_startup():
    # start-up dominated runs with noisy steps get more steps; cheap start-up gets the minimum
    assert steps_for_startup(8.0, 0.02, step_spread=0.3, run_spread=0.03) == 200
    assert steps_for_startup(0.1, 0.1) == 20
    m = steps_for_startup(4.0, 0.01, step_spread=0.1, run_spread=0.05)
    assert m == round(math.sqrt(math.pi / 2 * 400) * 2)
    assert steps_for_startup(float("nan"), 0.1) == 20 and steps_for_startup(1.0, 0.0) == 20


def test_log_spread():
    rng = random.Random(3)
    xs = [0.1 * math.exp(rng.gauss(0, 0.2)) for _ in range(4000)]
    assert log_spread(xs) == pytest.approx(0.2, rel=0.1)
    assert log_spread([0.1, 0.2]) == 0.0


def test_rotated_rounds():
    assert [rotated(["b", "x", "y"], r) for r in range(4)] == [
        ["b", "x", "y"],
        ["x", "y", "b"],
        ["y", "b", "x"],
        ["b", "x", "y"],
    ]
    assert rotated([], 3) == []


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def sampler(means: dict[str, float], clock: FakeClock, seed: int = 0, run_sd: float = 0.0, steps: int = 20):
    rng = random.Random(seed)
    calls: list[str] = []

    def sample(name: str) -> list[float]:
        calls.append(name)
        run = means[name] * math.exp(rng.gauss(0, run_sd))
        xs = noisy(run, steps, rng)
        clock.t += sum(xs)
        return xs

    return sample, calls


def test_sequential_rule_decides_each_arm_as_soon_as_it_can_and_stops_measuring_it():
    clock = FakeClock()
    means = {"base": 0.10, "fast": 0.08, "same": 0.10, "slow": 0.13}
    sample, calls = sampler(means, clock, seed=11)
    base, arms = Arm("base"), [Arm("fast"), Arm("same"), Arm("slow")]
    seen = []
    rounds = interleave(base, arms, sample, Settings(budget_s=1e9), clock=clock, on_progress=seen.append)
    v = {a.name: a.verdict for a in arms}
    assert v == {"fast": HELPED, "same": NO_CHANGE, "slow": HURT}
    assert all(a.decided_at >= 3 for a in arms)
    # a decided arm is not run again; the loop ends when every arm is decided
    for a in arms:
        assert len(a.rounds) == a.decided_at and calls.count(a.name) == a.decided_at
    assert rounds == max(a.decided_at for a in arms) < 12
    assert seen[-1].round == rounds and "fast: helped" in seen[-1].text()
    # rotating order: round 2 does not start with the baseline
    assert calls[0] == "base" and calls[4] == "fast"


def test_budget_end_leaves_open_arms_undecided_with_an_interval():
    clock = FakeClock()
    sample, _ = sampler({"base": 0.10, "near": 0.096}, clock, seed=2, run_sd=0.05)
    base, near = Arm("base"), Arm("near")
    seen = []
    n = interleave(base, [near], sample, Settings(budget_s=20.0), clock=clock, on_progress=seen.append)
    assert near.verdict == UNDECIDED and near.interval is not None and near.interval.rounds == n
    assert clock.t <= 20.0 + 2 * 4.0  # stopped before a round that would not fit (one round ~4 s)
    assert seen[0].eta_s is not None and seen[0].eta_s > 0


def test_runs_measured_before_the_rounds_count_as_round_one_and_failed_runs_are_skipped():
    clock = FakeClock()
    sample, calls = sampler({"base": 0.1, "x": 0.05}, clock)
    base, x = Arm("base"), Arm("x")
    base.add([0.1] * 20)

    def flaky(name: str):
        if name == "x" and calls.count("x") == 1:
            calls.append("x")
            return None  # the second run of x failed
        return sample(name)

    interleave(base, [x], flaky, Settings(budget_s=1e9), clock=clock)
    assert calls[0] == "x"  # round 1's baseline was already there
    assert x.rounds[1] == [] and x.verdict == HELPED and x.interval.rounds == len(x.rounds) - 1


def test_warmup_and_spikes_are_reported_per_arm():
    a = Arm("a")
    a.add([1.0, 0.1, 0.1, 0.1, 0.1, 0.8, 0.1], warmup=1)
    assert a.rounds == [[0.1] * 5] and [o.why for o in a.outliers] == ["warm-up", "spike"]
    d = a.to_dict()
    assert d["steps"] == 5 and len(d["outliers"]) == 2


def test_aa_pairs_are_rarely_called_helped():
    """Identical configurations with 10% run-to-run spread: the sequential rule calls at most a few of 40
    helped (the calibration benchmark measures the rate on real step functions)."""
    helped = 0
    for seed in range(40):
        clock = FakeClock()
        sample, _ = sampler({"base": 0.1, "same": 0.1}, clock, seed=seed, run_sd=0.1)
        arm = Arm("same")
        interleave(Arm("base"), [arm], sample, Settings(budget_s=1e9), clock=clock)
        helped += arm.verdict == HELPED
    assert helped <= 2


def test_blocks_cut_one_run_in_order():
    assert blocks([1, 2, 3, 4, 5, 6, 7], 3) == [[1, 2], [3, 4, 5], [6, 7]]
    assert blocks([1.0, 2.0], 5) == [[1.0], [2.0]]
    assert [len(b) for b in blocks(list(range(40)), 4)] == [10] * 4


def test_last_look_calls_helped_an_interval_above_one_at_the_stricter_confidence():
    iv = Interval(1.08, 1.02, 1.14, 20, 1, 1)  # faster, but the 95% interval does not clear 1.05
    strict = Interval(1.08, 1.005, 1.17, 20, 1, 1)
    assert decide(iv, 0.05, 3, hurt_iv=strict) is None  # while rounds go on: keep measuring
    assert decide(iv, 0.05, 3, hurt_iv=strict, final=True) == HELPED
    straddles = Interval(1.08, 0.99, 1.18, 20, 1, 1)
    assert decide(iv, 0.05, 3, hurt_iv=straddles, final=True) is None
    assert decide(iv, 0.05, 3, final=True) is None  # no stricter interval: no last-look rule


def test_budget_end_decides_a_sure_gain_under_the_margin_helped():
    """A real 1.05x: the 95% interval does not clear 1.05 within the budget, but the 99% one lies above 1
    at the end, so the arm ends helped, not undecided."""
    clock = FakeClock()
    sample, _ = sampler({"base": 0.10, "gain": 0.10 / 1.05}, clock, seed=5, run_sd=0.03)
    base, gain = Arm("base"), Arm("gain")
    n = interleave(base, [gain], sample, Settings(budget_s=60.0), clock=clock)
    assert gain.verdict == HELPED and gain.decided_at == n
    assert 1.0 < gain.interval.lo <= 1.05
    from pitstop.measure import faster_not_by_margin, judge_rounds

    assert faster_not_by_margin(gain.interval, 0.05)
    _, mid = judge_rounds(base.rounds, gain.rounds, Settings())
    assert mid is None  # the same rounds, read before the end, stay open


def test_runs_that_would_not_fit_leave_an_arm_out_first_and_end_the_rounds_later():
    """``fits``: in round 1 an arm whose run would not fit is left out (the baseline still runs once);
    later, the first run that would not fit ends the rounds, keeping the runs made."""
    calls: list[str] = []
    room = {"base": 2, "fast": 2, "slow": 0}  # runs that still fit, per arm

    def sample(name: str) -> list[float]:
        calls.append(name)
        room[name] -= 1
        return [0.1]

    base, fast, slow = Arm("base"), Arm("fast"), Arm("slow")
    room["base"] = 0  # the baseline's first run is made even so
    n = interleave(base, [fast, slow], sample, Settings.every_round(3), fits=lambda name: room[name] > 0)
    assert calls == ["base", "fast", "fast"] and n == 1  # round 2 (fast, base) stops at the baseline
    assert slow.left_out and not slow.rounds and slow.verdict is None
    assert len(fast.rounds) == 2 and fast.verdict == UNDECIDED


def test_a_baseline_alone_runs_its_rounds():
    calls: list[str] = []
    n = interleave(Arm("base"), [], lambda name: calls.append(name) or [0.1], Settings.every_round(3))
    assert n == 3 and calls == ["base"] * 3
