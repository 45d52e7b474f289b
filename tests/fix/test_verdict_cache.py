"""`pitstop fix`'s per-script verdicts, and how a later profile of the same script shows them."""

from __future__ import annotations

import json

from pitstop.findings import Finding, Severity
from pitstop.fix import verdict_cache as vc
from pitstop.fix.core import FixResult
from pitstop.fix.judge import Measured
from pitstop.measure import Interval


def measured(name, kind, verdict, est, lo, hi, on_top_of=None):
    m = Measured(name, kind, {}, verdict=verdict, on_top_of=on_top_of)
    m.interval = Interval(estimate=est, lo=lo, hi=hi, rounds=4, steps_base=80, steps_cand=80)
    m.speedup = est
    return m


def result_for(script, *cands):
    base = Measured("baseline (your script as it is)", "baseline", {}, verdict="baseline")
    return FixResult(command=["python", str(script)], baseline=base, candidates=list(cands))


def warn(fid):
    return Finding(id=fid, severity=Severity.WARN, title=fid, evidence="probe said 10 ms", est_saving_s=0.01)


def test_a_fix_measured_as_no_change_is_shown_and_demoted_in_a_later_profile(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("print(1)\n")
    out = tmp_path / "out"
    result = result_for(
        script,
        measured("autocast(bfloat16)", "amp", "no change", 1.00, 0.97, 1.03),
        measured("foreach=True", "foreach", "helped", 1.20, 1.12, 1.28),
        measured("keep host memory", "host_memory", "hurt", 0.95, 0.92, 0.98),
    )
    path = vc.record(result, out)
    assert path == out / vc.CACHE_NAME
    key = str(script.resolve())
    saved = json.loads(path.read_text())[key]
    assert {k: [e["verdict"] for e in v] for k, v in saved.items()} == {
        "amp": ["no change"],
        "foreach": ["helped"],
        "host_memory": ["hurt"],
    }
    found = [warn("precision.amp"), warn("optimizer.foreach"), warn("host.page_faults"), warn("sync.item")]
    by = {f.id: f for f in vc.annotate_profile(found, ["python", str(script)], out)}
    amp = by["precision.amp"]
    assert amp.severity is Severity.INFO
    date = saved["amp"][0]["date"]
    assert f"pitstop fix measured 1.00x (95% CI 0.97\u20131.03, 4 rounds, 80 steps each side) on {date}" in (
        amp.evidence
    )
    assert amp.data["fix_measured"]["verdict"] == "no change"
    assert by["host.page_faults"].severity is Severity.INFO and "hurt" in by["host.page_faults"].evidence
    assert by["optimizer.foreach"].severity is Severity.WARN  # the fix helped: the warning stands
    assert by["sync.item"] is found[3]
    # another script has its own entry: nothing carries over
    other = tmp_path / "other.py"
    other.write_text("print(2)\n")
    assert vc.annotate_profile(found, ["python", str(other)], out) == found


def test_a_kind_with_one_helping_measurement_is_not_demoted(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("")
    result = result_for(
        script,
        measured("num_workers=2", "workers", "no change", 1.01, 0.97, 1.05),
        measured("num_workers=4", "workers", "helped", 1.5, 1.4, 1.6),
    )
    vc.record(result, tmp_path)
    f = warn("dataloader.workers")
    assert vc.annotate_profile([f], ["python", str(script)], tmp_path) == [f]


def test_an_unconfirmed_info_finding_whose_fix_helped_every_time_becomes_a_confirmed_warning(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("")
    result = result_for(
        script,
        measured("keep host memory", "host_memory", "helped", 1.29, 1.20, 1.40),
        measured("num_workers=2", "workers", "helped", 1.5, 1.4, 1.6),
        measured("num_workers=4", "workers", "no change", 1.01, 0.97, 1.05),
    )
    vc.record(result, tmp_path)
    faults = Finding(id="host.page_faults", severity=Severity.INFO, title="t", evidence="not confirmed")
    workers = Finding(id="dataloader.workers", severity=Severity.INFO, title="t", evidence="not confirmed")
    by = {f.id: f for f in vc.annotate_profile([faults, workers], ["python", str(script)], tmp_path)}
    confirmed = by["host.page_faults"]
    assert confirmed.severity is Severity.WARN
    assert "confirmed by pitstop fix on the whole script: 1.29x (95% CI 1.20\u20131.40" in confirmed.evidence
    assert confirmed.data["fix_measured"]["interval"] == [1.20, 1.40]
    assert by["dataloader.workers"] is workers  # one of its fixes did not help: it stays as the profile said


def test_measurements_on_top_of_another_fix_and_undecided_ones_do_not_demote(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("")
    result = result_for(
        script,
        measured("autocast(bfloat16)", "amp", "no change", 1.0, 0.97, 1.03, on_top_of="num_workers=2"),
        measured("channels_last", "channels_last", "undecided", 1.04, 0.9, 1.2),
    )
    vc.record(result, tmp_path)
    found = [warn("precision.amp"), warn("memory_format.channels_last")]
    assert vc.annotate_profile(found, ["python", str(script)], tmp_path) == found


def test_no_cache_or_a_broken_one_leaves_findings_alone(tmp_path):
    f = warn("precision.amp")
    assert vc.annotate_profile([f], ["python", str(tmp_path / "t.py")], tmp_path) == [f]
    (tmp_path / vc.CACHE_NAME).write_text("{not json")
    assert vc.annotate_profile([f], ["python", str(tmp_path / "t.py")], tmp_path) == [f]


def test_without_an_out_dir_the_cache_lives_in_the_cache_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("PITSTOP_CACHE_DIR", str(tmp_path / "cache"))
    assert vc.cache_path(None) == tmp_path / "cache" / vc.CACHE_NAME
    monkeypatch.delenv("PITSTOP_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert vc.cache_path(None) == tmp_path / "xdg" / "pitstop" / vc.CACHE_NAME


def test_fix_cli_records_its_verdicts_for_the_script(tmp_path, monkeypatch):
    import pitstop.fix.runs as fix_runs
    from pitstop.cli import main

    script = tmp_path / "train.py"
    script.write_text("")
    result = result_for(script, measured("autocast(bfloat16)", "amp", "no change", 1.0, 0.97, 1.03))
    monkeypatch.setattr(fix_runs, "run_fix", lambda cmd, cfg, progress=None: result)
    out = tmp_path / "out"
    main(["fix", "--candidates", "amp", "--out-dir", str(out), "-q", "--", "python", str(script)])
    saved = json.loads((out / vc.CACHE_NAME).read_text())
    assert saved[str(script.resolve())]["amp"][0]["verdict"] == "no change"
