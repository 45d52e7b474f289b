"""pitstop compare of reports without step times (doctor): it says what it compared, no rows of dashes."""

from __future__ import annotations

import json

from pitstop.cli import main
from pitstop.findings import Finding, Report, Severity
from pitstop.report.jsonfmt import write_json


def doctor(*findings: Finding) -> Report:
    return Report(tool="doctor", findings=list(findings))


def test_two_doctor_reports_are_compared_by_their_findings(tmp_path, capsys, monkeypatch):
    swap = Finding(id="memory.swap", severity=Severity.WARN, title="swap in use")
    fd = Finding(id="system.fd_limit", severity=Severity.PASS, title="Open-file limit 65536")
    a, b, out = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "c.json"
    write_json(doctor(swap, fd), a)
    write_json(doctor(fd), b)
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["compare", str(a), str(b), "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "compared by their findings only" in text and "profile reports" in text
    assert "memory.swap" in text and "–" not in text  # no table of dashes
    assert all(len(line) <= 80 for line in text.splitlines())
    doc = json.loads(out.read_text())
    ids = {f["id"] for f in doc["findings"]}
    assert "compare.scope" in ids and "compare.speedup" not in ids
    assert doc["sections"]["pairs"][0]["disappeared"] == ["memory.swap"]
