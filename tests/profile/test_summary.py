"""The run's verdict when nothing warns: healthy only where no estimate of 5% or more went unconfirmed."""

from __future__ import annotations

from pitstop.findings import Finding, Severity
from pitstop.profile.analyze.summary import unconfirmed, verdict


def f(fid: str, est: float | None, share: float, severity=Severity.INFO, **data) -> Finding:
    return Finding(id=fid, severity=severity, title=fid, est_saving_s=est, share=share, data=data)


def test_small_or_confirmed_estimates_leave_the_run_healthy():
    found = [
        f("a.small", 0.001, 0.01, confirmed=False, saving_ci_s=None),  # under 5%: nothing to decide
        f("b.measured", 0.02, 0.2),  # no judgement made (an info that is not a prediction)
        f("c.pass", None, 0.0, Severity.PASS, confirmed=False),
    ]
    v = verdict(found, "healthy title", "10 steps", None, steps=10)
    assert v is not None and v.id == "summary.healthy" and v.title == "healthy title"
    assert v.evidence == "10 steps" and v.data["steps"] == 10


def test_a_warning_leaves_no_verdict():
    assert verdict([f("w", 0.02, 0.2, Severity.WARN)], "t", "m") is None
    assert verdict([f("e", None, 0.0, Severity.ERROR)], "t", "m") is None


def test_unconfirmed_estimates_of_five_percent_make_the_run_undecided():
    loader = f("dataloader.workers", 0.136, 0.38, confirmed=False, saving_ci_s=[-0.675, 0.227])
    odd = f("x.odd", 0.02, 0.06, confirmed=False, saving_ci_s=[None, None])  # bounds that are not numbers
    assert "x.odd 20 ms a step (6%; no interval)" in verdict([odd], "t", "m").evidence
    faults = f("host.page_faults", 0.0245, 0.07, confirmed=False, saving_ci_s=None, rank=1)
    small = f("x.small", 0.001, 0.01, confirmed=False, saving_ci_s=None)
    assert [g.id for g in unconfirmed([faults, small, loader])] == ["dataloader.workers", "host.page_faults"]
    v = verdict([faults, small, loader], "t", "20 steps, 238.4 ms median", 0.48)
    assert v is not None and v.id == "summary.unconfirmed" and v.severity is Severity.INFO
    assert "2 estimates that may reach it were not confirmed" in v.title
    assert v.data["unconfirmed"] == ["dataloader.workers", "host.page_faults"]
    assert "dataloader.workers 136 ms a step (38%; 95% CI -675 ms\u2013227 ms)" in v.evidence
    assert "host.page_faults (rank 1) 24.5 ms a step (7%; no interval)" in v.evidence
    assert "Other processes used at least 48% of the CPUs" in v.evidence and v.data["other_cpu_share"] == 0.48
    assert "pitstop fix" in v.fix


def test_an_undecided_small_estimate_whose_interval_reaches_five_percent_is_open():
    # 2% of the step by its estimate, up to 6% by its interval's upper bound: not a pass
    wide = f("precision.amp", 0.002, 0.02, confirmed=False, saving_ci_s=[-0.001, 0.006])
    tight = f("memory_format.channels_last", 0.002, 0.02, confirmed=False, saving_ci_s=[0.001, 0.003])
    assert [g.id for g in unconfirmed([wide, tight])] == ["precision.amp"]
    v = verdict([wide, tight], "t", "m")
    assert v is not None and v.id == "summary.unconfirmed" and v.data["unconfirmed"] == ["precision.amp"]
    assert verdict([tight], "t", "m").id == "summary.healthy"


def test_other_processes_load_is_quoted_only_when_it_matters():
    assert "Other processes" not in verdict([], "t", "m", 0.05).evidence
    assert "m. Other processes used at least 30%" in verdict([], "t", "m", 0.3).evidence
    assert "Other processes" not in verdict([], "t", "m", None).evidence


def test_reconcile_gives_the_verdict_again_after_the_findings_changed():
    from dataclasses import replace

    from pitstop.findings import Report
    from pitstop.profile.analyze.summary import BASIS, basis, reconcile

    loader = f("dataloader.workers", 0.136, 0.38, confirmed=False, saving_ci_s=[-0.6, 0.2])
    b = basis("healthy title", "20 steps", None, steps=20)
    rep = Report(tool="profile", findings=[loader, verdict([loader], **b)], meta={BASIS: b})
    assert [g.id for g in rep.findings] == ["dataloader.workers", "summary.unconfirmed"]
    # `pitstop fix` confirmed it on the whole script: a warning, and no verdict beside it
    rep.findings[0] = replace(loader, severity=Severity.WARN)
    reconcile(rep)
    assert [g.id for g in rep.findings] == ["dataloader.workers"]
    # then a fix run found it no faster (demoted, decided): nothing is left open, the run is healthy
    rep.findings[0] = replace(loader, data={**loader.data, "fix_measured": {"verdict": "no change"}})
    reconcile(rep)
    assert [g.id for g in rep.findings] == ["dataloader.workers", "summary.healthy"]
    assert rep.by_id("summary.healthy").data["steps"] == 20
    # a report without a basis (an older report, another tool) is left as it is
    bare = Report(tool="profile", findings=[replace(loader, severity=Severity.WARN), verdict([], **b)])
    reconcile(bare)
    assert len(bare.findings) == 2


def test_a_profile_report_keeps_the_basis_of_its_verdict():
    from pitstop.profile.analyze.summary import BASIS, reconcile
    from pitstop.profile.record.timeline import StepRecord
    from pitstop.profile.runs.runner import RunResult

    steps = [
        StepRecord(index=i, start_s=i * 0.1, total_s=0.1, forward_s=0.05, backward_s=0.04) for i in range(10)
    ]
    data = {"other_cpu_share": 0.3, "device": "cpu"}
    rep = RunResult(0, None, steps, [1.0] * 10, {}, None, 1.0, status="stopped", data=data).report()
    (v,) = [g for g in rep.findings if g.area == "summary"]
    assert v.id == "summary.healthy" and ". Other processes used at least 30%" in v.evidence
    assert rep.meta[BASIS]["steps"] == 10 and rep.to_dict()["meta"][BASIS]["other_cpu_share"] == 0.3
    reconcile(rep)  # nothing changed: the same verdict, once
    assert [g.id for g in rep.findings if g.area == "summary"] == ["summary.healthy"]
