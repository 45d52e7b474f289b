"""Plausible by construction: a finding never claims more than its events cost in isolation, nor more
than the part of the step it lives in. Synthetic measurements, no child process."""

from __future__ import annotations

import mmap

import pytest

from pitstop.findings import Severity
from pitstop.host import event_costs
from pitstop.profile.rules import findings_for
from pitstop.profile.timeline import StepRecord


def steps(n=10, total=0.1, **parts) -> list[StepRecord]:
    return [StepRecord(index=i, start_s=i * total, total_s=total, **parts) for i in range(n)]


def by_id(found, fid):
    return next(f for f in found if f.id == fid)


def test_fresh_pages_fault_once_each_and_the_cost_is_cached():
    _, _, faults = event_costs._fault_in(b"\x01" * (256 * mmap.PAGESIZE))
    assert faults >= 128  # every page of a fresh mapping faults on its first write (4 KiB pages)
    assert event_costs.page_fault_s() is event_costs.page_fault_s()
    assert event_costs.page_fault_bound_s(2e-6) == pytest.approx(event_costs.FAULT_COST_MULTIPLE * 2e-6)
    assert event_costs.page_fault_bound_s(None) is None


def test_a_fault_is_charged_at_most_a_multiple_of_its_isolated_cost():
    # 450 ms saved over 3,000 faults in the probe: 150 us a fault, where one costs 2 us in isolation
    hm = {"base_s": 0.5, "new_s": 0.05, "saving_s": 0.45, "base_faults": 3000, "new_faults": 0}
    data = {"probes": {"host_memory": {**hm, "isolated_fault_s": 2e-6}}}
    f = by_id(
        findings_for(steps(total=0.5, forward_s=0.4, minor_faults=3000), data, cores=2)[0], "host.page_faults"
    )
    bound = event_costs.FAULT_COST_MULTIPLE * 2e-6
    assert f.est_saving_s == pytest.approx(bound * 3000)  # 30 ms, not 450
    assert f.data["per_fault_s"] == pytest.approx(bound)
    assert "150.0 us per fault" in f.evidence and "not explained by faults" in f.evidence
    assert "(420.0 ms)" in f.evidence  # the rest of the probe's difference
    # without a calibration the probe's own price stands
    f = by_id(
        findings_for(
            steps(total=0.5, forward_s=0.4, minor_faults=3000), {"probes": {"host_memory": hm}}, cores=2
        )[0],
        "host.page_faults",
    )
    assert f.est_saving_s == pytest.approx(0.45) and "not explained" not in f.evidence


def test_fresh_runs_page_fault_saving_is_bounded_by_the_faults_too():
    two = {
        "base_s": 0.5,
        "new_s": 0.1,
        "saving_s": 0.4,
        "saving_lo_s": 0.35,
        "saving_hi_s": 0.45,
        "rounds": 4,
    }
    hm = {
        "base_s": 0.5,
        "new_s": 0.45,
        "saving_s": 0.05,
        "base_faults": 3000,
        "new_faults": 0,
        "isolated_fault_s": 2e-6,
        "two_process": two,
    }
    found, _ = findings_for(
        steps(total=0.5, forward_s=0.4, minor_faults=2000), {"probes": {"host_memory": hm}}, cores=2
    )
    f = by_id(found, "host.page_faults")
    limit = event_costs.FAULT_COST_MULTIPLE * 2e-6 * 2000
    assert f.est_saving_s == pytest.approx(limit) and f.data["capped"]["from_s"] == pytest.approx(0.4)
    assert f.data["saving_ci_s"] == pytest.approx([limit, limit])
    assert f.severity is Severity.INFO  # 20 ms of a 500 ms step: under the 5% bar once bounded
    assert "capped at 5x what its 2,000 faults per step cost" in f.evidence


def test_a_probe_saving_is_capped_at_the_forward_backward_part():
    # the probe (after the run, under load) measured 60 ms saved; the run's forward+backward is 30 ms
    p = {"base_s": 0.1, "new_s": 0.04, "saving_s": 0.06, "saving_lo_s": 0.05, "saving_hi_s": 0.07}
    data = {"models": [{"param_dtypes": ["float32"], "conv2d_layers": 3}], "probes": {"channels_last": p}}
    found, _ = findings_for(steps(forward_s=0.01, backward_s=0.02, data_wait_s=0.06), data, cores=2)
    f = by_id(found, "memory_format.channels_last")
    assert f.est_saving_s == pytest.approx(0.03) and f.share == pytest.approx(0.3)
    assert f.data["capped"] == {
        "from_s": pytest.approx(0.06),
        "to_s": pytest.approx(0.03),
        "at": "the forward + backward",
    }
    assert f.data["saving_ci_s"] == pytest.approx([0.03, 0.03])
    assert "capped at the forward + backward (30.0 ms per step)" in f.evidence
    assert f.severity is Severity.WARN  # still 30% of the step, confirmed
    # inside the part: untouched
    found, _ = findings_for(steps(forward_s=0.04, backward_s=0.04), data, cores=2)
    f = by_id(found, "memory_format.channels_last")
    assert f.est_saving_s == pytest.approx(0.06) and "capped" not in f.data


def test_a_cap_below_the_bar_makes_a_warning_info():
    p = {
        "type": "AdamW",
        "base_s": 0.05,
        "new_s": 0.01,
        "saving_s": 0.04,
        "saving_lo_s": 0.03,
        "saving_hi_s": 0.05,
    }
    data = {
        "optimizers": [{"type": "AdamW", "impl": "for-loop", "params": 40, "location": "train.py:5"}],
        "probes": {"optimizer": [p]},
    }
    found, _ = findings_for(steps(forward_s=0.05, optimizer_s=0.004), data, cores=2)
    f = by_id(found, "optimizer.foreach")
    assert f.est_saving_s == pytest.approx(0.004) and f.severity is Severity.INFO
    assert "capped at the optimizer" in f.evidence


def test_data_wait_finding_never_exceeds_the_data_wait():
    # fresh runs with workers measured 80 ms saved a step; the data wait is 50 ms
    two = {
        "base_s": 0.1,
        "new_s": 0.02,
        "saving_s": 0.08,
        "saving_lo_s": 0.07,
        "saving_hi_s": 0.09,
        "rounds": 4,
    }
    ld = {"location": "t.py:3", "num_workers": 0, "batches_seen": 10, "wait_s": 0.5, "batches_per_epoch": 100}
    data = {"loaders": [ld], "workers_two_process": two}
    found, _ = findings_for(steps(data_wait_s=0.05, forward_s=0.03), data, cores=4)
    f = by_id(found, "dataloader.workers")
    assert f.est_saving_s == pytest.approx(0.05) and f.data["capped"]["from_s"] == pytest.approx(0.08)
    assert "capped at the data wait (50.0 ms per step)" in f.evidence
