"""pitstop's timing layer: every in-process and fresh-run timing goes through it.

``engine``: samples, outliers, interleaved rounds, speed-up intervals, verdicts (its names are
re-exported here: ``from pitstop import measure; measure.interleave(...)``). ``throughput``: rates over
windows of steps. ``within_runs``: the interval from blocks of steps inside runs, for slow steps.
``plan``: how many rounds and steps a budget holds. ``clock``: the clock of in-process timers
(``Stopwatch``, ``time_block``, ``time_calls``).
"""

from pitstop.measure.engine import (
    HELPED,
    HURT,
    MAD_SCALE,
    NO_CHANGE,
    NO_GAIN,
    UNDECIDED,
    Arm,
    Cleaned,
    Interval,
    Outlier,
    Progress,
    Sample,
    Settings,
    against_bar,
    blocks,
    clean,
    decide,
    faster_not_by_margin,
    format_interval,
    interleave,
    judge_rounds,
    rotated,
    speedup_interval,
    t_quantile,
    update_verdicts,
)

__all__ = [
    "HELPED",
    "HURT",
    "MAD_SCALE",
    "NO_CHANGE",
    "NO_GAIN",
    "UNDECIDED",
    "Arm",
    "Cleaned",
    "Interval",
    "Outlier",
    "Progress",
    "Sample",
    "Settings",
    "against_bar",
    "blocks",
    "clean",
    "decide",
    "faster_not_by_margin",
    "format_interval",
    "interleave",
    "judge_rounds",
    "rotated",
    "speedup_interval",
    "t_quantile",
    "update_verdicts",
]
