"""What `pitstop fix` measured, kept per script so that later profiles of it can say so.

``pitstop fix`` writes each candidate's verdict (kind, verdict, speed-up and its 95% interval, date) to
``pitstop-fix-verdicts.json`` in the out dir (``--out-dir``; without one, the user's cache directory:
``$PITSTOP_CACHE_DIR``, else ``$XDG_CACHE_HOME/pitstop``, else ``~/.cache/pitstop``, so that nothing is
written next to the script), keyed by the script's resolved path (or ``-m module`` and the working
directory). A later ``pitstop profile`` of the same script reads it: a finding whose fix was
measured as *no change* or *hurt* says so with the measurement and is at most info, since the
prediction did not come true when the fix was applied to the whole script; an info finding whose fix
every measurement called *helped* is a warning, confirmed by the whole script's measurement (the
most cautious lower bound among them is what it claims).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pitstop.findings import Finding, Severity
from pitstop.measure import HELPED, HURT, NO_CHANGE
from pitstop.tune.fixjudge import SPEED_VERDICTS

if TYPE_CHECKING:
    from pitstop.tune.fix import FixResult

CACHE_NAME = "pitstop-fix-verdicts.json"
DISPROVED = (NO_CHANGE, HURT)


def script_key(command: list[str], cwd: str | None = None) -> str | None:
    """The script's resolved path (``module:NAME@DIR`` for ``-m``), or None when it is not a Python run."""
    from pitstop.profile.runner import CommandError, parse_command

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


def entries(result: FixResult, date: str | None = None) -> dict[str, list[dict[str, Any]]]:
    """Per candidate kind, the speed verdicts of its runs against the script as it is (measurements on
    top of another fix compare against that fix, not the script, and are left out)."""
    date = date or _dt.date.today().isoformat()
    out: dict[str, list[dict[str, Any]]] = {}
    for m in result.candidates:
        if m.verdict not in SPEED_VERDICTS or m.on_top_of or m.interval is None:
            continue
        iv = m.interval
        out.setdefault(m.kind, []).append(
            {
                "name": m.name,
                "verdict": m.verdict,
                "speedup": iv.estimate,
                "interval": [iv.lo, iv.hi],
                "interval_text": iv.text(),
                "date": date,
            }
        )
    return out


def record(result: FixResult, out_dir: str | Path | None, cwd: str | None = None) -> Path | None:
    """Write ``result``'s verdicts for its script (replacing that script's earlier ones), atomically."""
    key = script_key(result.command, cwd)
    found = entries(result)
    if key is None or not found:
        return None
    data = load(out_dir)
    data[key] = found
    path = cache_path(out_dir)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".verdicts-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1)
        os.replace(tmp, path)
    except OSError:  # a read-only or full disk: the verdicts are in the report anyway
        return None
    return path


def annotate(findings: list[Finding], verdicts: dict[str, list[dict[str, Any]]]) -> list[Finding]:
    """Findings whose fix every measurement found no faster (no change, hurt): at most info, saying so."""
    from pitstop.tune.fix import FINDING_KINDS

    out = []
    for f in findings:
        runs = verdicts.get(FINDING_KINDS.get(f.id, ""), [])
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
