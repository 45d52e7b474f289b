"""The options of `pitstop fix`, one dataclass; argparse is built from it (``pitstop.cliopts``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pitstop.cliopts import opt
from pitstop.recipes.registry import fix_kinds


@dataclass
class FixArgs:
    steps: int | None = opt(
        None, "timed steps per run (default: from the baseline's start-up and step time, 20 to 200)"
    )
    warmup: int = opt(5, "warm-up steps per run (default 5)")
    budget: float = opt(
        300.0, "seconds for the whole measurement; candidates still open then are 'undecided' (default 300)"
    )
    min_rounds: int = opt(3, "rounds before any verdict (default 3)")
    max_rounds: int = opt(40, "rounds at most per stage; the budget ends them first (40)")
    candidates: str = opt(
        "auto",
        f"auto (from the profile's findings), all, or a comma list of: {', '.join(fix_kinds())}",
    )
    skip: str = opt("", "candidates never to try, e.g. compile (same names)")
    min_gain: float = opt(0.05, "speed-up needed to count as helped (0.05)")
    loss_rtol: float = opt(0.1, "allowed relative change of the mean loss")
    timeout: float = opt(600.0, "seconds per run before it is stopped")
    apply: bool = opt(False, "write the fixes that helped into your script (asks first)")
    yes: bool = opt(False, "with --apply: do not ask")
    out_dir: str | None = opt(
        None,
        "keep the verdicts here for later `pitstop profile --out-dir DIR` runs of the same script "
        "(default: the user's cache directory, ~/.cache/pitstop)",
        metavar="DIR",
        output="dir",
    )
    cmd: Sequence[str] | None = opt(None, "-- python train.py ARGS", remainder=True)
