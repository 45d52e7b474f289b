"""The timing engine's throughput: speed-ups as steps per wall-clock second over the measured window.

``pitstop.measure`` cleans each run's steps (warm-up and slow spikes out) so its rounds and intervals
track the typical step. A user's own timer sees every step of the window, the spikes too: the batch a
fresh worker pool waits for, an eval pass, the step that other processes interrupted. So the speed-up
pitstop prints is throughput, the ratio of steps per wall-clock second over the same windows, spikes
included; a ratio of medians may stand beside it, never instead of it. This module holds that ratio
and its interval, on the engine's rounds and with its verdict rule (``measure.decide``).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from pitstop.measure.engine import HELPED, HURT, NO_CHANGE, Arm, Interval, Settings, decide, t_quantile


@dataclass(frozen=True)
class Window:
    """One run's measured window: how many steps it ran and the wall seconds they took, spikes included."""

    steps: int
    seconds: float

    @property
    def rate(self) -> float | None:
        """Steps per wall-clock second (None for an empty window)."""
        return self.steps / self.seconds if self.steps and self.seconds > 0 else None


def window(samples: Sequence[float]) -> Window:
    """The window of one run's per-step times: every step counts, the slow ones too (a spike, an eval
    pass, a worker restart cost the user's run that time)."""
    vals = [float(v) for v in samples if math.isfinite(v) and v > 0]
    return Window(len(vals), math.fsum(vals))


def pooled(windows: Sequence[Window]) -> Window:
    """Several windows as one: a configuration's throughput over all its runs."""
    return Window(sum(w.steps for w in windows), math.fsum(w.seconds for w in windows))


def arm_windows(arm: Arm, skip: Sequence[str] = ("warm-up",)) -> list[Window]:
    """Each round of ``arm`` as a window: its kept steps plus the outliers dropped from that round
    (all but those whose ``why`` is in ``skip``: warm-up steps precede the measured window)."""
    out = []
    for r, kept in enumerate(arm.rounds):
        dropped = [o.seconds for o in arm.outliers if o.run == r and o.why not in skip]
        out.append(window([*kept, *dropped]))
    return out


def throughput_interval(
    base: Sequence[Window], cand: Sequence[Window], confidence: float = 0.95
) -> Interval | None:
    """Throughput speed-up of ``cand`` over ``base`` (> 1: more steps per wall-clock second) with its
    interval: round ``r`` of each side is paired; the estimate is the ratio of total steps over total
    seconds of the paired rounds (what a user's own timer shows over the same runs), and the interval
    is Student t over the per-round log ratios around it, the rounds being the unit as in
    ``speedup_interval``. None when no round has both sides; one round gives an unbounded interval."""
    pairs = [(b, c) for b, c in zip(base, cand, strict=False) if b.rate and c.rate]
    if not pairs:
        return None
    b_steps, b_s = sum(b.steps for b, _ in pairs), math.fsum(b.seconds for b, _ in pairs)
    c_steps, c_s = sum(c.steps for _, c in pairs), math.fsum(c.seconds for _, c in pairs)
    est = (c_steps / c_s) / (b_steps / b_s)
    n = len(pairs)
    if n < 2:
        lo, hi = 0.0, math.inf
    else:
        d = [math.log(c.rate / b.rate) for b, c in pairs]  # type: ignore[operator]
        half = t_quantile(confidence, n - 1) * statistics.stdev(d) / math.sqrt(n)
        lo, hi = est * math.exp(-half), est * math.exp(half)
    return Interval(est, lo, hi, n, b_steps, c_steps, confidence)


def judge_throughput(
    base: Sequence[Window], cand: Sequence[Window], s: Settings, final: bool = False
) -> tuple[Interval | None, str | None]:
    """``judge_rounds`` on throughput: the interval at ``s.confidence`` and the verdict ``decide`` allows
    now, the hurt rule (and the last look's helped rule) reading the same windows at
    ``s.hurt_confidence``."""
    iv = throughput_interval(base, cand, s.confidence)
    strict = throughput_interval(base, cand, s.hurt_confidence) if s.hurt_confidence > s.confidence else None
    return iv, decide(iv, s.min_gain, s.min_rounds, strict, final)


def rejudge_throughput(base: Arm, arms: Sequence[Arm], s: Settings, round_no: int) -> None:
    """Every arm that is open or holds a speed verdict gets the verdict its throughput allows now (None:
    open again), so rounds stop on throughput, spikes included; other verdicts (a failure) stay."""
    windows = arm_windows(base)
    for a in arms:
        if a.verdict not in (None, HELPED, HURT, NO_CHANGE):
            continue
        a.interval, v = judge_throughput(windows, arm_windows(a), s)
        if v != a.verdict:
            a.verdict, a.decided_at = v, (round_no if v else None)


__all__ = [
    "Window",
    "arm_windows",
    "judge_throughput",
    "pooled",
    "rejudge_throughput",
    "throughput_interval",
    "window",
]
