"""measure.throughput: the speed-up as steps per wall-clock second over the window, spikes included."""

from __future__ import annotations

import math
import statistics

import pytest

from pitstop.measure import HELPED, NO_CHANGE, Arm, Settings, speedup_interval
from pitstop.measure.throughput import (
    Window,
    arm_windows,
    judge_throughput,
    pooled,
    rejudge_throughput,
    throughput_interval,
    window,
)

BASE = [0.10] * 10
SPIKY = [0.05] * 9 + [0.50]  # half the step time, but one slow step per run (a worker pool's restart)


def test_window_counts_every_step_the_spike_too():
    w = window(SPIKY)
    assert (w.steps, w.seconds) == (10, pytest.approx(0.95)) and w.rate == pytest.approx(10 / 0.95)
    assert window([]).rate is None
    assert pooled([Window(10, 1.0), Window(30, 2.0)]) == Window(40, 3.0)


def test_a_spike_makes_the_throughput_ratio_differ_from_the_median_ratio():
    medians = speedup_interval([BASE] * 4, [SPIKY] * 4)
    tp = throughput_interval([window(BASE)] * 4, [window(SPIKY)] * 4)
    assert medians is not None and tp is not None
    assert medians.estimate == pytest.approx(2.0)
    assert tp.estimate == pytest.approx((10 / 0.95) / (10 / 1.0))  # 1.05x: what a timer shows
    assert tp.lo == pytest.approx(tp.estimate) and tp.hi == pytest.approx(tp.estimate)
    assert (tp.rounds, tp.steps_base, tp.steps_cand) == (4, 40, 40)


def test_the_estimate_is_total_steps_over_total_seconds_and_the_interval_is_over_rounds():
    base = [Window(10, 1.0), Window(10, 1.2), Window(10, 0.8)]
    cand = [Window(20, 1.0), Window(10, 0.5), Window(10, 0.5)]
    iv = throughput_interval(base, cand)
    assert iv is not None
    assert iv.estimate == pytest.approx((40 / 2.0) / (30 / 3.0))
    logs = [math.log(2.0), math.log(2.4), math.log(1.6)]
    assert iv.lo < iv.estimate < iv.hi
    assert math.log(iv.hi / iv.estimate) == pytest.approx(
        4.302653 * statistics.stdev(logs) / math.sqrt(3), rel=1e-4
    )
    one = throughput_interval(base[:1], cand[:1])
    assert one is not None and one.rounds == 1 and math.isinf(one.hi)
    assert throughput_interval([Window(0, 0.0)], [Window(3, 1.0)]) is None


def test_arm_windows_put_the_dropped_spikes_back_but_not_the_warm_up():
    arm = Arm("c")
    arm.add([0.3, 0.3, *SPIKY], warmup=2)
    assert [o.why for o in arm.outliers] == ["warm-up", "warm-up", "spike"]
    (w,) = arm_windows(arm)
    assert (w.steps, w.seconds) == (10, pytest.approx(0.95))


def test_verdicts_follow_the_throughput_not_the_median():
    s = Settings(min_rounds=3)
    base, cand = Arm("base"), Arm("cand")
    same = [0.05] * 9 + [0.55]  # the median halves; the run takes as long as the baseline's
    for _ in range(4):
        base.add(BASE)
        cand.add(same)
    _, median_verdict = judge_throughput([window(BASE)] * 4, [window([0.05] * 10)] * 4, s)
    assert median_verdict == HELPED  # without the spike it would be 2x
    cand.verdict = HELPED  # what the median rule decided
    rejudge_throughput(base, [cand], s, 4)
    assert cand.verdict == NO_CHANGE and cand.interval is not None  # 1.00x
    failed = Arm("failed", verdict="failed")
    rejudge_throughput(base, [failed], s, 4)
    assert failed.verdict == "failed"


def test_profiles_steps_per_s_is_throughput_not_the_median_step():
    from pitstop.profile.record.timeline import StepRecord, steps_per_s

    steps = [StepRecord(index=i, start_s=0.0, total_s=t) for i, t in enumerate(SPIKY)]
    assert steps_per_s(steps) == pytest.approx(10 / 0.95)  # the median step would say 20
    assert steps_per_s([]) == 0.0
