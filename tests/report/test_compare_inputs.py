"""Commands that read JSON given a malformed file, a list, or a file that is not the report they take: exit
2 with one line saying what was expected and what the file holds, never a traceback."""

from __future__ import annotations

import json

import pytest

from pitstop.cli import main
from pitstop.findings import Finding, Report, Severity
from pitstop.report.jsonfmt import write_json


def _profile(path, step_s=0.1):
    steps = [{"index": i, "total_s": step_s, "warmup": False} for i in range(12)]
    write_json(Report(tool="profile", sections={"steps": steps}, meta={"status": "stopped"}), path)
    return path


@pytest.mark.parametrize(
    ("content", "says"),
    [
        ("[1, 2]", "got a JSON list"),
        ('{"tool": ', "is not JSON"),
        ("\xff\xfe", "is not JSON"),
        (
            '{"version": 1, "status": "stopped", "steps": []}',
            "got an object with keys status, steps, version",
        ),
        ('{"tool": "compare", "findings": []}', "is a compare report"),
        ('{"tool": "profile", "findings": [{"id": "x"}]}', "not as pitstop writes it"),
        ('{"tool": "profile", "sections": {"steps": {"a": 1}}}', "not as pitstop writes it"),
        (
            '{"tool": "profile", "sections": {"breakdown": {"median_step_s": "1"}}}',
            "not as pitstop writes it",
        ),
    ],
    ids=["list", "truncated", "binary", "measurements", "compare", "finding", "steps", "median"],
)
def test_compare_refuses_what_is_not_a_report_with_one_line(tmp_path, capsys, content, says):
    bad = tmp_path / "bad.json"
    bad.write_bytes(content.encode("latin-1"))
    code = main(["compare", "-q", str(_profile(tmp_path / "p.json")), str(bad)])
    err = capsys.readouterr().err
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and says in err and "bad.json" in err, err
    assert "Traceback" not in err


def test_compare_refuses_reports_of_two_commands(tmp_path, capsys):
    doctor = tmp_path / "d.json"
    write_json(Report(tool="doctor", findings=[Finding("cpu.threads", Severity.PASS, "ok")]), doctor)
    assert main(["compare", "-q", str(_profile(tmp_path / "p.json")), str(doctor)]) == 2
    assert "different kinds" in capsys.readouterr().err


def test_compare_still_compares_two_profile_reports(tmp_path):
    out = tmp_path / "cmp.json"
    a, b = _profile(tmp_path / "a.json", 0.2), _profile(tmp_path / "b.json", 0.1)
    assert main(["compare", "-q", str(a), str(b), "--json", str(out)]) == 0
    assert json.loads(out.read_text())["tool"] == "compare"


def test_a_fix_verdict_cache_of_the_wrong_shape_is_ignored(tmp_path):
    from pitstop.fix.verdict_cache import CACHE_NAME, annotate_profile, script_key

    script = tmp_path / "train.py"
    script.write_text("")
    key = script_key(["python", str(script)])
    f = Finding("dataloader.workers", Severity.WARN, "waits")
    for cache in ([1], {key: [1]}, {key: {"workers": "helped"}}, {key: {"workers": [1, "x"]}}):
        (tmp_path / CACHE_NAME).write_text(json.dumps(cache))
        assert annotate_profile([f], ["python", str(script)], tmp_path) == [f]
