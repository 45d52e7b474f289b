"""What ``pitstop fix`` measured for a script, read back: a later ``pitstop profile`` of the same script
annotates its findings with the verdicts ``pitstop.fix.verdict_cache`` recorded (where the cache lives,
how a script is keyed, and what a verdict does to a finding are described there).
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

from pitstop.findings import Finding, Severity
from pitstop.measure import HELPED, HURT, NO_CHANGE
from pitstop.profile.process.command import CommandError, parse_command
from pitstop.recipes import finding_kinds

CACHE_NAME = "pitstop-fix-verdicts.json"
DISPROVED = (NO_CHANGE, HURT)


def script_key(command: list[str], cwd: str | None = None) -> str | None:
    """The script's resolved path (``module:NAME@DIR`` for ``-m``), or None when it is not a Python run."""
    try:
        kind, target, _ = parse_command(command, cwd)
    except CommandError:
        return None
    base = Path(cwd or ".").resolve()
    if kind == "module":
        return f"module:{target}@{base}"
    return str((base / target).resolve())


def default_dir() -> Path:
    if os.environ.get("PITSTOP_CACHE_DIR"):
        return Path(os.environ["PITSTOP_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "pitstop"


def cache_path(out_dir: str | Path | None) -> Path:
    return (Path(out_dir) if out_dir else default_dir()) / CACHE_NAME


def load(out_dir: str | Path | None) -> dict[str, Any]:
    """The whole cache ({} when missing or unreadable: it only adds notes to a report)."""
    try:
        data = json.loads(cache_path(out_dir).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def annotate(findings: list[Finding], verdicts: dict[str, list[dict[str, Any]]]) -> list[Finding]:
    """Findings whose fix every measurement found no faster (no change, hurt): at most info, saying so."""
    kinds = finding_kinds()
    out = []
    for f in findings:
        runs = verdicts.get(kinds.get(f.id, ""), [])
        if f.severity is Severity.INFO and runs and all(r.get("verdict") == HELPED for r in runs):
            out.append(_confirmed(f, runs))
            continue
        if f.severity is Severity.PASS or not runs or not all(r.get("verdict") in DISPROVED for r in runs):
            out.append(f)
            continue
        best = max(runs, key=lambda r: r.get("speedup") or 0.0)
        note = (
            f"pitstop fix measured {best.get('interval_text') or best.get('speedup')} on {best.get('date')}: "
            f"{best.get('verdict')} ({best.get('name')})"
        )
        severity = Severity.INFO if f.severity.rank > Severity.INFO.rank else f.severity
        data = {**f.data, "fix_measured": best}
        out.append(replace(f, severity=severity, evidence=f"{f.evidence}; {note}", data=data))
    return out


def _confirmed(f: Finding, runs: list[dict[str, Any]]) -> Finding:
    """``f`` as a warning: the whole script with its fix measured faster in every run of ``pitstop fix``."""
    surest = min(runs, key=lambda r: (r.get("interval") or [r.get("speedup") or 0.0])[0])
    note = (
        f"confirmed by pitstop fix on the whole script: {surest.get('interval_text') or surest.get('speedup')} "
        f"on {surest.get('date')} ({surest.get('name')})"
    )
    return replace(
        f, severity=Severity.WARN, evidence=f"{f.evidence}; {note}", data={**f.data, "fix_measured": surest}
    )


def annotate_profile(
    findings: list[Finding], command: list[str], out_dir: str | Path | None
) -> list[Finding]:
    """``annotate`` with this script's verdicts from the cache in ``out_dir``."""
    key = script_key(command)
    verdicts = load(out_dir).get(key) if key else None
    if not isinstance(verdicts, dict):
        return findings
    # a cache edited by hand or written by another version: only entries of the shape ``record`` writes
    kept = {k: [r for r in v if isinstance(r, dict)] for k, v in verdicts.items() if isinstance(v, list)}
    return annotate(findings, kept)
