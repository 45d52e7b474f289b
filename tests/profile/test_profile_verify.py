"""`pitstop profile --verify`: the top warning's fix measured next to its prediction (fake fix runs)."""

from __future__ import annotations

import json

import pytest

from pitstop.findings import Finding, Report, Severity
from pitstop.fix import verdict_cache as vc
from pitstop.fix import verify as vf
from pitstop.fix.core import FixResult
from pitstop.fix.judge import Measured
from pitstop.measure import Interval
from pitstop.profile.analyze.summary import unconfirmed


def report_with(*findings):
    return Report(tool="profile", findings=list(findings), sections={"breakdown": {"median_step_s": 0.1}})


def amp_warning():
    return Finding(
        id="precision.amp",
        severity=Severity.WARN,
        title="fp32",
        est_saving_s=0.02,
        share=0.2,
        data={"saving_ci_s": [0.01, 0.03]},
    )


def fake_run_fix(verdict, est, lo, hi, calls):
    def run_fix(command, cfg):
        calls.append((command, cfg))
        base = Measured("baseline", "baseline", {}, verdict="baseline")
        m = Measured("autocast(bfloat16)", "amp", {}, verdict=verdict)
        m.interval = Interval(estimate=est, lo=lo, hi=hi, rounds=4, steps_base=80, steps_cand=80)
        return FixResult(command=list(command), baseline=base, candidates=[m])

    return run_fix


def test_prediction_from_the_saving_and_its_interval():
    point, bounds = vf.predicted_speedup(amp_warning(), 0.1)
    assert point == pytest.approx(1.25) and bounds == pytest.approx([0.1 / 0.09, 0.1 / 0.07])
    assert vf.predicted_speedup(replace_data(amp_warning(), None), 0.1)[1] is None


def replace_data(f, ci):
    from dataclasses import replace

    return replace(f, data={"saving_ci_s": ci})


def test_a_fix_that_helps_as_predicted_is_shown_next_to_the_prediction(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("")
    calls = []
    sync = Finding(id="sync.item", severity=Severity.WARN, title="sync", est_saving_s=0.001)
    report = report_with(amp_warning(), sync)
    f = vf.verify(
        report, ["python", str(script)], 60.0, tmp_path, fake_run_fix("helped", 1.2, 1.15, 1.26, calls)
    )
    ((cmd, cfg),) = calls
    assert cmd == ["python", str(script)]
    assert cfg.candidates == ("amp",) and cfg.budget == 60.0
    assert f.id == "profile.verify" and f.data["verdict"] == "helped" and f.data["inside_prediction"] is True
    assert "predicted 1.25x (95% CI 1.11\u20131.43), measured 1.20x (95% CI 1.15\u20131.26" in f.title
    assert report.by_id("precision.amp").severity is Severity.WARN
    saved = json.loads((tmp_path / vc.CACHE_NAME).read_text())
    assert saved[str(script.resolve())]["amp"][0]["verdict"] == "helped"


def test_a_fix_measured_as_no_change_demotes_the_warning(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("")
    report = report_with(amp_warning())
    f = vf.verify(
        report, ["python", str(script)], 60.0, tmp_path, fake_run_fix("no change", 1.0, 0.97, 1.03, [])
    )
    assert f.data["inside_prediction"] is False
    amp = report.by_id("precision.amp")
    assert amp.severity is Severity.INFO and "pitstop fix measured 1.00x" in amp.evidence


def test_no_warning_with_a_fix_means_nothing_is_run(tmp_path):
    calls = []
    report = report_with(Finding(id="sync.item", severity=Severity.WARN, title="sync", est_saving_s=0.01))
    f = vf.verify(report, ["python", "t.py"], 60.0, tmp_path, fake_run_fix("helped", 1.2, 1.1, 1.3, calls))
    assert calls == [] and f.title == "No warning with a fix to verify"


def test_fix_config_times_the_one_worker_count_the_warning_suggests():
    f = Finding(id="dataloader.workers", severity=Severity.WARN, title="", data={"usable_cores": 2})
    cfg = vf.fix_config(f, "workers", 60.0, steps=10)
    # recipes.workers on 2 cores: one worker, one core left to the training process
    assert cfg.candidates == ("workers",) and cfg.workers_values == (1,) and cfg.steps == 10
    # the count the finding itself suggested, when it carries one
    f3 = Finding(id="dataloader.workers", severity=Severity.WARN, title="", data={"suggested_workers": 3})
    assert vf.fix_config(f3, "workers", 60.0).workers_values == (3,)
    assert vf.fix_config(amp_warning(), "amp", 60.0).workers_values is None


def loader_bound_run(spec, **_):
    from pitstop.profile.record.timeline import StepRecord
    from pitstop.profile.runs.runner import RunResult

    steps = [
        StepRecord(index=i, start_s=0.1 * i, total_s=0.1, data_wait_s=0.06, forward_s=0.02) for i in range(12)
    ]
    loader = {"location": "train.py:3", "num_workers": 0, "batches_seen": 12, "wait_s": 0.72, "iterators": 1}
    return RunResult(0, None, steps, [], {}, None, 2.0, status="stopped", data={"loaders": [loader]})


def test_profile_verify_prints_the_measured_speed_up_and_a_later_profile_shows_the_no_change(
    tmp_path, monkeypatch, capsys
):
    import pitstop.fix.runs as fix_runs
    import pitstop.profile.runs.runner as runner_mod
    from pitstop.cli import main

    script = tmp_path / "train.py"
    script.write_text("")
    out = tmp_path / "out"
    calls = []

    def run_fix(command, cfg):
        calls.append(cfg)
        base = Measured("baseline", "baseline", {}, verdict="baseline")
        m = Measured("num_workers=2", "workers", {}, verdict="no change")
        m.interval = Interval(estimate=1.01, lo=0.98, hi=1.04, rounds=6, steps_base=60, steps_cand=60)
        return FixResult(command=list(command), baseline=base, candidates=[m])

    monkeypatch.setattr(runner_mod, "run", loader_bound_run)
    monkeypatch.setattr("pitstop.host.cpu.usable_cores", lambda: 4)  # the sure saving: 3/4 of the wait
    monkeypatch.setattr(fix_runs, "run_fix", run_fix)
    # no fresh runs of the workers fix: the wait's own model predicts (as where the script cannot re-run)
    monkeypatch.setattr("pitstop.profile.confirm.workers_confirm.maybe_confirm", lambda *a, **k: False)
    first = tmp_path / "first.json"
    argv = ["profile", "--out-dir", str(out), "--json", str(first), "--", "python", str(script)]
    main([*argv[:1], "--verify", "30", *argv[1:]])
    printed = " ".join(capsys.readouterr().out.split())
    (cfg,) = calls
    assert cfg.candidates == ("workers",) and cfg.budget == 30.0
    doc = json.loads(first.read_text())
    timings = doc["meta"]["timings"]  # each stage's seconds, the default budget, --verify's time
    assert timings["budget_s"] == 60.0 and {"startup_s", "window_s", "probes_s", "verify_s"} <= set(timings)
    by = {f["id"]: f for f in doc["findings"]}
    title = by["profile.verify"]["title"]
    assert title.startswith("dataloader.workers: predicted 2.50x (95% CI 1.82\u20132.50)"), title
    assert "measured 1.01x (95% CI 0.98\u20131.04, 6 rounds, 60 steps each side) (no change)" in title
    assert "measured 1.01x" in printed and "predicted 2.50x" in printed
    assert by["dataloader.workers"]["severity"] == "info"
    # a later profile of the same script, without --verify: the no-change verdict from the cache
    later = tmp_path / "later.json"
    main(["profile", "--out-dir", str(out), "--json", str(later), "-q", "--", "python", str(script)])
    workers = next(f for f in json.loads(later.read_text())["findings"] if f["id"] == "dataloader.workers")
    assert (
        workers["severity"] == "info"
        and "pitstop fix measured 1.01x (95% CI 0.98\u20131.04" in (workers["evidence"])
    )
    assert "no change (num_workers=2)" in workers["evidence"] and len(calls) == 1


def test_an_undecided_fix_measured_below_the_whole_predicted_interval_demotes_the_warning(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("")
    report = report_with(amp_warning())  # predicted 1.25x (95% CI 1.11-1.43)
    f = vf.verify(
        report, ["python", str(script)], 60.0, tmp_path, fake_run_fix("undecided", 1.02, 0.95, 1.08, [])
    )
    assert f.data["below_prediction"] is True and "lies below the predicted one" in f.evidence
    amp = report.by_id("precision.amp")
    assert amp.severity is Severity.INFO and "--verify measured 1.02x (95% CI 0.95\u20131.08" in amp.evidence
    # not disproved (the interval still holds a gain): open, so the run is not called healthy
    assert amp.data["confirmed"] is False and [g.id for g in unconfirmed(report.findings)] == [
        "precision.amp"
    ]
    # overlapping the prediction: still open, the warning stands
    report = report_with(amp_warning())
    f = vf.verify(
        report, ["python", str(script)], 60.0, tmp_path, fake_run_fix("undecided", 1.1, 1.0, 1.2, [])
    )
    assert f.data["below_prediction"] is False and report.by_id("precision.amp").severity is Severity.WARN


def test_the_prediction_is_throughput_from_the_mean_step(tmp_path):
    """A step's saving is a mean, and the clock sees the mean step: with slow steps the mean is 0.2 s
    where the median is 0.1 s, and a 0.05 s saving predicts 0.2 / 0.15, not 0.1 / 0.05."""
    script = tmp_path / "train.py"
    script.write_text("")
    warn = Finding(id="precision.amp", severity=Severity.WARN, title="fp32", est_saving_s=0.05, share=0.25)
    report = Report(
        tool="profile", findings=[warn], sections={"breakdown": {"median_step_s": 0.1, "mean_step_s": 0.2}}
    )
    f = vf.verify(report, ["python", str(script)], 60.0, tmp_path, fake_run_fix("helped", 1.3, 1.2, 1.4, []))
    assert f.data["predicted_speedup"] == pytest.approx(0.2 / 0.15)
