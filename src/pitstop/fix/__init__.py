"""``pitstop fix``: fixes proven by re-running the user's script with each one injected, and written into
the script by ``fix --apply``.

    from pitstop.fix import FixConfig, run_fix, fix_report   # re-run a script with candidate fixes injected
    from pitstop.fix import apply_all                        # write the patches of the fixes that helped

Its modules: ``core`` (the config, the result and the candidates from the registry), ``dist`` (the
candidates of a launcher's ranks), ``runs`` (the rounds of child runs), ``judge`` (verdicts through
``pitstop.measure``), ``estimate`` and ``progress`` (how long it takes, as it goes), ``report`` (findings,
report, HTML), ``apply`` (``fix --apply``'s edits), ``verdict_cache`` (what later profiles show),
``verify`` (``profile --verify``), ``cli``.

The public names above are served from their modules when first asked for, so that importing
``pitstop.fix.cli`` stays light (modules import torch lazily where they can, so ``pitstop --help`` stays
fast). See docs/tune.md.
"""

from __future__ import annotations

import importlib
from typing import Any

_PUBLIC = {
    "FixConfig": "pitstop.fix.core",
    "FixResult": "pitstop.fix.core",
    "build_candidates": "pitstop.fix.core",
    "parse_candidates": "pitstop.fix.core",
    "Measured": "pitstop.fix.judge",
    "run_fix": "pitstop.fix.runs",
    "fix_findings": "pitstop.fix.report",
    "fix_report": "pitstop.fix.report",
    "apply_all": "pitstop.fix.apply",
}


def __getattr__(name: str) -> Any:
    if name in _PUBLIC:
        return getattr(importlib.import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "FixConfig",
    "FixResult",
    "Measured",
    "apply_all",
    "build_candidates",
    "fix_findings",
    "fix_report",
    "parse_candidates",
    "run_fix",
]
