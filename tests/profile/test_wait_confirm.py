"""The data-wait prediction (dataloader.workers) judged by its interval over blocks of the run's steps."""

from __future__ import annotations

import pytest

from pitstop.findings import Severity
from pitstop.profile.analyze import wait_confirm as wc
from pitstop.profile.analyze.rules import findings_for
from pitstop.profile.record.timeline import StepRecord

LOADER = {
    "location": "train.py:12",
    "num_workers": 0,
    "batches_seen": 12,
    "batches_per_epoch": 100,
    "wait_s": 0.3,
    "first_batch_s": [0.05],
    "iterators": 1,
}


def steps(waits, total=0.1):
    return [
        StepRecord(index=i, start_s=i * total, total_s=total, data_wait_s=w, forward_s=(total - w) / 2)
        for i, w in enumerate(waits)
    ]


def workers(waits, total=0.1, cores=4, device=None):
    data = {"loaders": [LOADER], **({"device": device} if device else {})}
    found, _ = findings_for(steps(waits, total), data, cores=cores)
    return next(f for f in found if f.id == "dataloader.workers")


def test_blocks_are_contiguous_and_cover_every_step():
    s = steps([0.01] * 20)
    bl = wc.blocks(s)
    assert [len(b) for b in bl] == [4, 4, 3, 3, 3, 3] and [x for b in bl for x in b] == s
    assert [len(b) for b in wc.blocks(steps([0.01] * 40))] == [5] * 8  # at most MAX_BLOCKS
    assert wc.blocks(steps([0.01] * 2)) == []


def test_a_steady_wait_is_a_confirmed_warning_with_its_interval():
    f = workers([0.06, 0.061, 0.059] * 4)  # 60% of a 100 ms step, the same in every block
    assert f.severity is Severity.WARN and f.data["confirmed"] is True
    lo, hi = f.data["saving_ci_s"]
    # on the CPU the workers share the 4 cores with the compute: at worst a quarter of the wait stays
    assert 0.75 * 0.059 <= lo <= 0.75 * 0.06 and f.est_saving_s <= hi < 0.062
    assert "confirmed: saving 60 ms (95% CI" in f.evidence and f.data["saving_blocks"] == 4
    assert "from 4 blocks of the run's steps, its lower bound leaving 1/4 of the wait" in f.evidence


def test_a_wait_in_one_stretch_of_the_run_is_not_confirmed():
    # 22% of the step on average, but all of it in the first block: the lower bound is below 5%
    f = workers([0.09] * 3 + [0.0] * 9)
    assert f.est_saving_s == pytest.approx(0.0225) and f.share >= 0.05
    assert f.severity is Severity.INFO and f.data["confirmed"] is False
    assert f.data["saving_ci_s"][0] < 0.005
    assert "not confirmed" in f.evidence and "lower bound at 5%" in f.evidence


def test_too_few_steps_for_two_blocks_is_info_without_an_interval():
    f = workers([0.06] * 5)
    assert f.severity is Severity.INFO and f.data["saving_ci_s"] is None
    assert "fewer than 2 blocks" in f.evidence


def test_the_saving_bounds_follow_the_speed_up_bounds():
    from pitstop.measure import Interval

    iv = Interval(estimate=2.0, lo=1.25, hi=4.0, rounds=4, steps_base=12, steps_cand=12)
    assert wc.saving_bounds(iv, 0.1) == pytest.approx((0.02, 0.075))
    one = Interval(estimate=2.0, lo=0.0, hi=float("inf"), rounds=1, steps_base=3, steps_cand=3)
    assert wc.saving_bounds(one, 0.1) is None


def test_on_the_cpu_the_lower_bound_leaves_the_wait_share_of_one_core():
    two = workers([0.06] * 12, cores=2)
    assert two.data["saving_ci_s"] == pytest.approx([0.03, 0.06]) and two.severity is Severity.WARN
    gpu = workers([0.06] * 12, cores=2, device="cuda:0")
    assert gpu.data["saving_ci_s"] == pytest.approx([0.06, 0.06])
    # one core: the workers' loading takes the compute's core; nothing sure is saved
    found, _ = findings_for(steps([0.06] * 12), {"loaders": [LOADER]}, cores=1)
    one = next(f for f in found if f.id == "dataloader.workers")
    assert one.data["saving_ci_s"][0] == 0.0 and one.severity is Severity.INFO
