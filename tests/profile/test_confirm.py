"""Probe predictions: a warning only when the interval's lower bound is >= 5% of the median step."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pitstop.findings import Finding, Severity
from pitstop.profile.analyze import confirm
from pitstop.profile.analyze.rules import findings_for
from pitstop.profile.record.timeline import StepRecord, breakdown


def steps(n=10, total=0.1, **parts) -> list[StepRecord]:
    return [StepRecord(index=i, start_s=i * total, total_s=total, **parts) for i in range(n)]


def probe(saving, lo=None, hi=None, base=0.05, **kw):
    p = {"base_s": base, "new_s": base - saving, "saving_s": saving, **kw}
    if lo is not None:
        p.update(saving_lo_s=lo, saving_hi_s=hi)
    return p


def cl_finding(p):
    data = {"models": [{"param_dtypes": ["float32"], "conv2d_layers": 3}], "probes": {"channels_last": p}}
    found, _ = findings_for(steps(forward_s=0.05), data, cores=2)  # median step 100 ms
    return next(f for f in found if f.id == "memory_format.channels_last")


def test_lower_bound_at_five_percent_of_the_step_is_a_confirmed_warning():
    f = cl_finding(probe(0.02, lo=0.006, hi=0.03))
    assert f.severity is Severity.WARN
    assert f.data["confirmed"] is True and f.data["saving_ci_s"] == pytest.approx([0.006, 0.03])
    assert "confirmed: saving 20 ms (95% CI 6 ms\u201330 ms)" in f.evidence


def test_lower_bound_under_five_percent_is_info_not_confirmed():
    f = cl_finding(probe(0.02, lo=0.004, hi=0.03))
    assert f.severity is Severity.INFO
    assert f.data["confirmed"] is False and f.data["saving_ci_s"] == pytest.approx([0.004, 0.03])
    assert "not confirmed: saving 20 ms (95% CI 4 ms\u201330 ms)" in f.evidence
    assert f.est_saving_s == pytest.approx(0.02)  # the point estimate stays, for the reader


def test_no_interval_is_info_not_confirmed():
    f = cl_finding(probe(0.02))  # too few rounds: no bounds
    assert f.severity is Severity.INFO and f.data["saving_ci_s"] is None
    assert "not confirmed" in f.evidence and "too few probe rounds" in f.evidence


def test_a_before_after_probe_says_why_it_has_no_interval():
    hm = {**probe(0.01, base_faults=3000, new_faults=0), "confirmed": False}
    found, _ = findings_for(
        steps(forward_s=0.05, minor_faults=4000), {"probes": {"host_memory": hm}}, cores=2
    )
    f = next(f for f in found if f.id == "host.page_faults")
    assert f.severity is Severity.INFO and "cannot be interleaved" in f.evidence
    # nothing confirmed costs 5%, but a 13 ms estimate on a 100 ms step was not confirmed: not healthy
    ids = [g.id for g in found]
    assert "summary.healthy" not in ids
    verdict = next(g for g in found if g.id == "summary.unconfirmed")
    assert verdict.data["unconfirmed"] == ["host.page_faults"]
    assert "host.page_faults 13.3 ms a step (13%; no interval)" in verdict.evidence


def test_page_fault_interval_scales_with_the_run_faults():
    # 3,000 faults in the probe, 4,000 a step in the run: the saving and its bounds scale by 4/3.
    hm = probe(0.01, lo=0.006, hi=0.014, base_faults=3000, new_faults=0)
    found, _ = findings_for(
        steps(forward_s=0.05, minor_faults=4000), {"probes": {"host_memory": hm}}, cores=2
    )
    f = next(f for f in found if f.id == "host.page_faults")
    assert f.severity is Severity.WARN
    assert f.data["saving_ci_s"] == pytest.approx([0.008, 0.014 * 4 / 3])


def test_optimizer_probe_interval_is_read_from_its_probe_record():
    opt = {"type": "Adam", "impl": "for-loop", "params": 40, "location": "train.py:9"}
    p = {"type": "Adam", **probe(0.01, lo=0.001, hi=0.02)}
    found, _ = findings_for(
        steps(optimizer_s=0.02), {"optimizers": [opt], "probes": {"optimizer": [p]}}, cores=2
    )
    f = next(f for f in found if f.id == "optimizer.foreach")
    assert f.severity is Severity.INFO and f.data["saving_ci_s"] == pytest.approx([0.001, 0.02])


def test_fp16_against_bf16_shifts_the_interval_with_the_point_estimate():
    fp16 = probe(0.03, lo=0.025, hi=0.035)  # fp32 -> fp16 saves 30 ms
    f = Finding(
        id="precision.fp16",
        severity=Severity.WARN,
        title="",
        data={"fp16_scaler": fp16, "bf16_s": 0.03},
        est_saving_s=0.01,  # fp16 against bf16's 30 ms
    )
    assert confirm.saving_bounds(f, fp16) == pytest.approx((0.005, 0.015))


def test_findings_that_are_not_probe_predictions_are_left_alone():
    bd = breakdown(steps(data_wait_s=0.06))
    f = Finding(id="dataloader.workers", severity=Severity.WARN, title="", est_saving_s=0.06)
    passed = Finding(id="precision.amp", severity=Severity.PASS, title="", data=probe(-0.001))
    decided = replace(passed, data={**passed.data, "saving_ci_s": [-0.003, 0.001]})
    (g, p) = confirm.apply([f, decided], bd)
    assert g == f and p.severity is Severity.PASS and p.data["verdict"] == "no gain"
    # a hardware fact (no probe measured anything) is a pass as it is
    fact = Finding(
        id="precision.amp", severity=Severity.PASS, title="no fast bf16", data={"skipped": "no AMX"}
    )
    assert confirm.apply([fact], bd) == [fact]


def test_a_pass_without_a_deciding_interval_is_undecided():
    bd = breakdown(steps())
    passed = Finding(id="precision.amp", severity=Severity.PASS, title="fp32 is as fast", data=probe(-0.001))
    for ci in (None, [-0.003, 0.006]):  # no interval; one reaching 5% of the 100 ms step
        data = {**passed.data, "saving_ci_s": ci}
        (f,) = confirm.apply([replace(passed, data=data)], bd)
        assert f.severity is Severity.INFO and f.data["verdict"] == "undecided"
        assert "pitstop fix --candidates amp" in f.fix and f.title.startswith("Undecided")
    # page faults: the run's faults at the most one can cost bound the saving
    faults = {"base_s": 0.05, "new_s": 0.05, "saving_s": 0.0, "faults_per_step": 3}
    few = Finding(id="host.page_faults", severity=Severity.PASS, title="few faults", data=faults)
    assert confirm.apply([few], bd)[0].severity is Severity.PASS
    many = replace(few, data={**faults, "faults_per_step": 4000})
    assert confirm.apply([many], bd)[0].severity is Severity.INFO
