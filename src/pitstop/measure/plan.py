"""Planning a measurement: how long its rounds may take and how many steps a run should time.

``budget_for_rounds`` sizes a budget that holds the sequential rule's first look (``measure.decide``);
``steps_for_startup`` picks the steps per run that give the narrowest interval for a fixed budget, from the
within-run spread ``log_spread`` measures. ``pitstop.measure`` then runs the rounds.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from pitstop.measure.engine import MAD_SCALE


def budget_for_rounds(
    round_s: float, rounds: int, floor_s: float, cap_s: float, margin: float = 1.25
) -> float:
    """Seconds that hold ``rounds`` rounds of ``round_s`` (with ``margin``), within [``floor_s``, ``cap_s``]:
    slow steps get the time the sequential rule's first look (``decide`` from ``min_rounds``) needs."""
    if not (round_s > 0 and math.isfinite(round_s)):
        return floor_s
    return min(max(cap_s, floor_s), max(floor_s, margin * rounds * round_s))


def steps_for_startup(
    startup_s: float,
    step_s: float,
    step_spread: float = 0.15,
    run_spread: float = 0.05,
    lo: int = 20,
    hi: int = 200,
) -> int:
    """Timed steps per run that give the narrowest interval for a fixed budget, within [``lo``, ``hi``].

    A round costs ``startup_s + m * step_s`` per configuration; the variance of one round's log ratio is
    ``2 * (run_spread**2 + (pi / 2) * step_spread**2 / m)`` (a run's own factor, plus the noise of the
    median of ``m`` steps). Their product, the variance per second of budget, is smallest at
    ``m = sqrt((pi / 2) * startup_s / step_s) * step_spread / run_spread``. The spreads are standard
    deviations of log times: ``step_spread`` of the steps within a run (measured: the scaled MAD of a
    run), ``run_spread`` of whole runs (a quiet machine's process-to-process spread unless measured)."""
    if not (step_s > 0 and math.isfinite(startup_s) and startup_s > 0 and run_spread > 0):
        return lo
    m = math.sqrt(math.pi / 2 * startup_s / step_s) * step_spread / run_spread
    return int(min(hi, max(lo, round(m))))


def log_spread(samples: Sequence[float]) -> float:
    """Scaled MAD of the log step times of one run: the within-run spread ``steps_for_startup`` takes."""
    logs = [math.log(v) for v in samples if v > 0 and math.isfinite(v)]
    if len(logs) < 3:
        return 0.0
    med = statistics.median(logs)
    return MAD_SCALE * statistics.median(abs(v - med) for v in logs)
