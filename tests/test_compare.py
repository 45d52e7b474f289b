"""pitstop compare: side by side, findings diff, speed-up with a bootstrap interval; CLI outputs."""

from __future__ import annotations

import json
import random

import jsonschema
import pytest
from rich.console import Console

from pitstop.cli import main
from pitstop.compare.reports import CompareError, compare, print_compare, throughput_ratio
from pitstop.findings import Finding, Report, Severity
from pitstop.report.jsonfmt import load_schema, write_json


def profile_report(step_s: float, n: int = 30, spread: float = 0.05, seed: int = 0, findings=()) -> Report:
    rng = random.Random(seed)
    steps = [
        {"index": i, "total_s": step_s * (1 + rng.uniform(-spread, spread)), "warmup": i < 3}
        for i in range(n + 3)
    ]
    measured = sorted(s["total_s"] for s in steps if not s["warmup"])
    bd = {
        "steps": n,
        "mean_step_s": sum(measured) / n,
        "median_step_s": measured[n // 2],
        "data_wait_s": 0.5 * step_s,
    }
    return Report(
        tool="profile",
        findings=list(findings),
        sections={"steps": steps, "breakdown": bd},
        meta={"status": "stopped", "steps_per_s": 1 / bd["median_step_s"]},
    )


WORKERS = Finding(id="dataloader.workers", severity=Severity.WARN, title="waits for data <b>")
SYNC = Finding(id="sync.item", severity=Severity.WARN, title="item() per step")
CL = Finding(id="memory_format.channels_last", severity=Severity.PASS, title="no faster")


def test_throughput_ratio_interval_holds_the_true_ratio_and_is_reproducible():
    rng = random.Random(1)
    a = [0.2 * (1 + rng.gauss(0, 0.05)) for _ in range(40)]
    b = [0.1 * (1 + rng.gauss(0, 0.05)) for _ in range(40)]
    r = throughput_ratio(a, b)
    assert r.low < 2.0 < r.high and r.low < r.value < r.high
    assert r.high - r.low < 0.3
    assert throughput_ratio(a, b) == r and r.blocks == 4  # a pure function of the samples
    few = throughput_ratio([1.0, 2.0], [1.0])
    assert few.low is None and few.value == 1.5 and few.median == 1.5
    with pytest.raises(ValueError):
        throughput_ratio([], [1.0])


def test_the_speedup_is_throughput_with_the_median_beside_it():
    """One slow step in ten (a worker restart): the median step halves, the wall clock barely moves."""
    before = [0.10] * 30
    after = ([0.05] * 9 + [0.50]) * 3
    r = throughput_ratio(before, after)
    assert r.median == pytest.approx(2.0)
    assert r.value == pytest.approx(3.0 / 2.85) and r.low == pytest.approx(r.value)
    base, other = profile_report(0.1), profile_report(0.1)
    for rep, times in ((base, before), (other, after)):
        rep.sections["steps"] = [{"index": i, "total_s": t, "warmup": False} for i, t in enumerate(times)]
    out = compare([base, other], ["before", "after"])
    speed = out.by_id("compare.speedup")
    assert speed.data["speedup"] == pytest.approx(r.value) and speed.data["median_speedup"] == pytest.approx(
        2.0
    )
    assert "1.05x faster" in speed.title and "2.00x" not in speed.title
    assert speed.evidence.startswith("1.05x in throughput") and "(2.00x)" in speed.evidence
    assert out.sections["reports"][1]["steps_per_s"] == pytest.approx(30 / 2.85)


def test_compare_reports_speedup_interval_and_findings_that_changed():
    before = profile_report(0.2, findings=[WORKERS, CL])
    after = profile_report(0.1, seed=1, findings=[SYNC, CL])
    out = compare([before, after], ["before.json", "after.json"])
    speed = out.by_id("compare.speedup")
    assert speed.severity is Severity.INFO and "after.json is 2.0" in speed.title
    assert 1.85 < speed.data["low"] <= speed.data["speedup"] <= speed.data["high"] < 2.15
    assert speed.data["n_baseline"] == 30
    diff = out.by_id("compare.findings")
    assert diff.data == {"disappeared": ["dataloader.workers"], "appeared": ["sync.item"]}
    assert diff.severity is Severity.WARN  # a new problem appeared
    rows = out.sections["reports"]
    assert [r["label"] for r in rows] == ["before.json", "after.json"]
    assert rows[0]["parts_s"]["data_wait_s"] == pytest.approx(0.1)


def test_a_slower_run_is_a_warning_and_noise_says_so():
    base = profile_report(0.1)
    slower = compare([base, profile_report(0.2, seed=2)], ["a", "b"]).by_id("compare.speedup")
    assert slower.severity is Severity.WARN and "slower than a" in slower.title
    assert 1.8 < 1 / slower.data["speedup"] < 2.2
    same = compare([base, profile_report(0.1, seed=3)], ["a", "b"]).by_id("compare.speedup")
    assert same.severity is Severity.INFO and "within noise" in same.title


def test_reports_without_samples_get_no_interval_and_other_kinds_are_refused():
    a, b = profile_report(0.2), profile_report(0.1)
    a.sections["steps"] = []
    f = compare([a, b], ["a", "b"]).by_id("compare.speedup")
    assert f.data["low"] is None and "no interval" in f.evidence
    with pytest.raises(CompareError, match="different kinds"):
        compare([a, Report(tool="bench")], ["a", "b"])
    with pytest.raises(CompareError):
        compare([a], ["a"])


def test_terminal_table_at_80_columns_shows_labels_and_speedup():
    out = compare(
        [profile_report(0.2), profile_report(0.1, seed=1)], ["before-the-loader-fix.json", "after.json"]
    )
    console = Console(width=80, record=True, color_system=None)
    print_compare(out, console)
    text = console.export_text()
    assert all(len(line) <= 80 for line in text.splitlines())
    assert "before-the-loader-fix.json" in text and "after.json" in text
    assert "speed-up" in text and "2.0" in text


def test_cli_writes_schema_valid_json_and_escaped_html(tmp_path, capsys):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    write_json(profile_report(0.2, findings=[WORKERS]), a)
    write_json(profile_report(0.1, seed=1), b)
    out_json, out_html = tmp_path / "cmp.json", tmp_path / "cmp.html"
    assert main(["compare", str(a), str(b), "--json", str(out_json), "--html", str(out_html)]) == 0
    doc = json.loads(out_json.read_text())
    jsonschema.validate(doc, load_schema())
    assert doc["tool"] == "compare" and doc["sections"]["pairs"][0]["disappeared"] == ["dataloader.workers"]
    page = out_html.read_text()
    assert "Side by side" in page and "<b>" not in page
    assert "speed-up" in capsys.readouterr().out


def test_cli_usage_errors_exit_2(tmp_path):
    a = tmp_path / "a.json"
    write_json(profile_report(0.2), a)
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert main(["compare", str(a)]) == 2
    assert main(["compare", str(a), str(bad)]) == 2
    bench = tmp_path / "bench.json"
    write_json(Report(tool="bench"), bench)
    assert main(["compare", str(a), str(bench)]) == 2
