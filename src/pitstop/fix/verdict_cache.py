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
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pitstop.fix.judge import SPEED_VERDICTS
from pitstop.profile.confirm.fix_verdicts import (
    CACHE_NAME,
    DISPROVED,
    annotate,
    annotate_profile,
    cache_path,
    default_dir,
    load,
    script_key,
)

if TYPE_CHECKING:
    from pitstop.fix.core import FixResult


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


# the reading side lives in pitstop.profile.confirm.fix_verdicts (profile reads the cache); served here too
__all__ = [
    "CACHE_NAME",
    "DISPROVED",
    "annotate",
    "annotate_profile",
    "cache_path",
    "default_dir",
    "entries",
    "load",
    "record",
    "script_key",
]
