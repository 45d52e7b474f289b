import json
import math

import jsonschema
import pytest

from pitstop.findings import Finding, Report, Severity, rank_findings
from pitstop.report import load_json, render_html, to_json, write_json
from pitstop.report.html import bar_chart, line_chart, stacked_bar, table
from pitstop.report.jsonfmt import load_schema


def sample_report() -> Report:
    r = Report(tool="doctor", meta={"argv": ["x"], "nested": {"a": 1}})
    r.add(
        Finding("gpu.present", Severity.INFO, "No GPU", evidence="torch.cuda.is_available() is False"),
        Finding("memory.shm", Severity.WARN, "/dev/shm is small", evidence="64 MB", data={"bytes": 64 << 20}),
        Finding(
            "dataloader.workers",
            "error",
            "Data wait",
            evidence="61% of 40 steps",
            est_saving_s=0.5,
            share=0.61,
        ),
        Finding("cpu.threads", Severity.PASS, "Threads ok", data={"nan": math.nan, "tup": (1, 2)}),
    )
    return r


def test_severity_order_and_ranking():
    fs = sample_report().findings
    ranked = rank_findings(fs)
    assert [f.severity for f in ranked] == [Severity.ERROR, Severity.WARN, Severity.INFO, Severity.PASS]
    a = Finding("x.a", Severity.WARN, "a", est_saving_s=0.1)
    b = Finding("x.b", Severity.WARN, "b", est_saving_s=0.9)
    assert rank_findings([a, b])[0] is b


def test_area_and_worst():
    r = sample_report()
    assert r.by_id("memory.shm").area == "memory"
    assert r.worst() is Severity.ERROR
    assert Report(tool="t").worst() is Severity.PASS


def test_json_validates_against_schema_and_round_trips(tmp_path):
    r = sample_report()
    d = json.loads(to_json(r))
    jsonschema.validate(d, load_schema())
    assert d["summary"] == {"pass": 1, "info": 1, "warn": 1, "error": 1, "total": 4}
    assert d["findings"][0]["id"] == "dataloader.workers"
    assert d["findings"][-1]["data"] == {"nan": None, "tup": [1, 2]}
    p = write_json(r, tmp_path / "sub" / "r.json")
    back = load_json(p)
    assert {f.id for f in back.findings} == {f.id for f in r.findings}
    assert not list((tmp_path / "sub").glob(".*tmp"))


def test_schema_rejects_bad_id():
    d = json.loads(to_json(sample_report()))
    d["findings"][0]["id"] = "NoDots"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(d, load_schema())


def test_html_escapes_everything_user_supplied():
    hostile = "<script>alert(1)</script>"
    r = Report(tool="profile", error=f"RuntimeError: {hostile}", meta={"script": hostile})
    r.add(
        Finding(
            "sync.item",
            Severity.WARN,
            hostile,
            evidence=hostile,
            fix=hostile,
            fix_code=hostile,
            location=hostile,
        )
    )
    blocks = [
        table(hostile, [hostile], [[hostile, 1.5]]),
        bar_chart(hostile, [hostile], [1.0], unit=hostile),
        stacked_bar(hostile, {hostile: 1.0, "b": 2.0}),
        line_chart(hostile, [0, 1], {hostile: [1.0, 2.0]}, xlabel=hostile, ylabel=hostile),
    ]
    page = render_html(r, blocks)
    assert "<script" not in page
    assert page.count("&lt;script&gt;") >= 10
    assert 'data-id="sync.item"' in page


def test_charts_survive_empty_and_nonfinite():
    assert "no data" in line_chart("t", [], {}).html
    assert "<svg" in bar_chart("t", ["a"], [math.inf]).html
    assert "<svg" in stacked_bar("t", {"a": 0.0}).html


def test_written_reports_get_the_umask_mode(tmp_path):
    import os

    old = os.umask(0o022)
    try:
        p = write_json(sample_report(), tmp_path / "r.json")
    finally:
        os.umask(old)
    assert p.stat().st_mode & 0o777 == 0o644


def test_ranking_within_a_severity_uses_the_saving_lower_bound_when_known():
    # a: 20 ms predicted but only 2 ms sure; b: 10 ms with 8 ms sure; c: 5 ms measured, no interval;
    # d: a 4 ms prediction judged without an interval, so nothing of it is sure.
    a = Finding(
        id="a.x", severity=Severity.WARN, title="", est_saving_s=0.02, data={"saving_ci_s": [0.002, 0.03]}
    )
    b = Finding(
        id="b.x", severity=Severity.WARN, title="", est_saving_s=0.01, data={"saving_ci_s": [0.008, 0.012]}
    )
    c = Finding(id="c.x", severity=Severity.WARN, title="", est_saving_s=0.005)
    none = Finding(id="d.x", severity=Severity.WARN, title="", est_saving_s=0.004, data={"saving_ci_s": None})
    assert [f.id for f in rank_findings([a, c, none, b])] == ["b.x", "c.x", "a.x", "d.x"]
    # a lower bound under 0 is no sure saving either: the larger estimate breaks the tie
    neg = Finding(id="f.x", severity=Severity.WARN, title="", est_saving_s=0.003, data={"saving_ci_s": [-0.001, 0.006]})
    assert [f.id for f in rank_findings([none, neg])] == ["d.x", "f.x"]
    # severity still comes first
    err = Finding(id="e.x", severity=Severity.ERROR, title="")
    assert rank_findings([b, err])[0] is err
