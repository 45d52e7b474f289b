"""`pitstop fix`'s judge: the runs of one configuration, and its verdict from the timing engine.

A configuration's runs are child runs of the user's script (``pitstop.profile.runs.runner``). Each run gives
per-step times (its ``StepRecord``s after the warm-up). The speed-up and its verdict are throughput
(``pitstop.measure.throughput``): steps per wall-clock second over each run's measured window, every
step counted, the slow spikes and the steps with a no-grad eval pass inside too, since the user's own
timer sees them; paired by round into an interval and a verdict: *helped*, *hurt*, *no change* or
*undecided* (budget spent; the last look also calls *helped* an interval wholly above 1 at 99%). The
median step (``pitstop.measure`` drops the spikes and the eval steps for it, as outliers) is reported
beside it. A candidate is *rejected* whatever its speed when it did not really apply (the override was
skipped, compile fell back to eager) or its loss moved away from the baseline's (more than ``loss_rtol``
of the mean, or the baseline's own run-to-run spread if larger); *failed* when no run of it measured a
step.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from pitstop.measure import (
    HELPED,
    HURT,
    NO_CHANGE,
    UNDECIDED,
    Arm,
    Interval,
    Outlier,
    Settings,
    faster_not_by_margin,
)
from pitstop.measure.throughput import arm_windows, judge_throughput, pooled
from pitstop.profile.runs.runner import RunResult

SPEED_VERDICTS = (HELPED, HURT, NO_CHANGE, UNDECIDED)


@dataclass
class Measured:
    """All runs of one configuration."""

    name: str
    kind: str
    overrides: dict[str, Any]
    why: str = ""
    steps_per_s: list[float] = field(default_factory=list)  # per run: steps / wall s of its window, spikes in
    loss_means: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # overrides that did not apply, and why
    cannot_help: str | None = None  # the script's own facts say it has nothing to act on (still measured)
    median: float | None = None  # steps/s from the median kept step time over all runs (shown beside)
    throughput: float | None = None  # steps / wall seconds over all its runs' windows, spikes included
    speedup: float | None = None  # throughput over the reference's, in the paired rounds
    interval: Interval | None = None
    verdict: str = ""  # baseline | helped | hurt | no change | undecided | rejected | failed
    reason: str = ""
    # Measured on top of another fix (second round): what it was compared against, and that one's median.
    on_top_of: str | None = None
    # Judged on speed alone (hurt, no change, undecided): every other check passed.
    speed_only: bool = False
    ref_runs: list[float] = field(default_factory=list)  # the reference's steps/s, interleaved with these
    ref_throughput: float | None = None  # the reference's throughput over those runs
    ref_median: float | None = None  # and its median step rate
    unfinished: int = 0  # runs stopped because the budget ended while they ran
    arm: Arm = field(default_factory=lambda: Arm(""))

    def __post_init__(self) -> None:
        self.arm.name = self.name

    def add(self, r: RunResult) -> list[float] | None:
        """Record one run's losses, errors and skipped overrides; return its step times for the engine
        (None: the run measured nothing). Steps with an eval pass inside are outliers, not samples."""
        if not r.ok or not r.steps:
            self.errors.append(r.error or f"run ended with status {r.status} and no measured step")
            return None
        finite = [v for v in r.losses if isinstance(v, float) and math.isfinite(v)]
        if r.losses and len(finite) < len(r.losses):
            self.errors.append(f"non-finite loss in {len(r.losses) - len(finite)} of {len(r.losses)} steps")
        if finite:
            self.loss_means.append(statistics.fmean(finite))
        for ld in r.config.get("loaders") or []:
            for key, why in (ld.get("overrides_skipped") or {}).items():
                self._skip(f"{key}: {why}")
        if r.config.get("compile_error"):
            self._skip(f"compile fell back to eager: {r.config['compile_error']}")
        for msg in r.config.get("override_errors") or []:
            self._skip(msg)
        run = len(self.arm.rounds)  # the engine adds this run's round after this returns
        self.arm.outliers.extend(Outlier(run, i, s.total_s, "eval") for i, s in enumerate(r.steps) if s.eval)
        return [s.total_s for s in r.steps if not s.eval]

    def record(self, r: RunResult, warmup: int = 0, k: float = 5.0) -> None:
        """``add`` for a run made outside the engine's rounds (it becomes the next round)."""
        times = self.add(r)
        if times is None:
            self.arm.rounds.append([])
            self.arm.run_s.append(r.wall_s)
        else:
            self.arm.add(times, warmup, k, r.wall_s)

    def _skip(self, msg: str) -> None:
        if msg not in self.skipped:
            self.skipped.append(msg)

    def blocked(self, measured_now: bool = False) -> str | None:
        """The verdict this configuration gets whatever its speed (a failure, an override that did not
        apply), so it needs no more runs; None if it has none. ``measured_now``: the run just added
        measured steps (the engine has not stored them yet)."""
        if self.errors:
            return "rejected" if measured_now or any(self.arm.rounds) else "failed"
        if self.skipped:
            return "rejected"
        return None

    def to_dict(self) -> dict[str, Any]:
        d = {k: v for k, v in self.__dict__.items() if k not in ("arm", "interval")}
        d["interval"] = self.interval.to_dict() if self.interval else None
        d["interval_text"] = self.interval.text() if self.interval else None
        d["outliers"] = [o.__dict__ for o in self.arm.outliers]
        d["steps_measured"] = self.arm.steps
        d["rounds"] = len(self.arm.rounds)
        return d


def judge(m: Measured, base: Measured, cfg: Any) -> None:
    """Set ``m.median``, ``m.throughput``, ``m.interval``, ``m.speedup``, ``m.verdict`` and ``m.reason``
    against ``base``.

    The speed verdict is the throughput interval's (``measure.throughput.judge_throughput``, at the last
    look once the rounds are over); failures, overrides that did not apply and a changed loss override
    it. ``cfg`` is the ``FixConfig`` (``min_gain``, ``loss_rtol``, ``min_rounds``)."""
    min_gain, loss_rtol = cfg.min_gain, cfg.loss_rtol
    windows = arm_windows(m.arm)
    m.steps_per_s = [w.rate for w in windows if w.rate]
    m.throughput = pooled(windows).rate
    kept = [v for r in m.arm.rounds for v in r]
    m.median = 1.0 / statistics.median(kept) if kept else None
    if m is base:
        m.verdict, m.speedup = "baseline", 1.0 if m.throughput else None
        m.reason = m.errors[0] if m.errors else ""
        return
    settings = Settings(min_gain=min_gain, min_rounds=cfg.min_rounds)
    # judged once the rounds are over: the last look's rule applies
    m.interval, engine = judge_throughput(arm_windows(base.arm), windows, settings, final=True)
    m.speedup = m.interval.estimate if m.interval else None
    m.speed_only = False
    if m.errors and not m.steps_per_s:
        m.verdict, m.reason = "failed", m.errors[0]
        return
    if m.errors:
        m.verdict, m.reason = "rejected", m.errors[0]
        return
    if m.skipped:
        m.verdict, m.reason = "rejected", "did not apply: " + "; ".join(m.skipped)
        return
    if m.interval is None:
        if m.unfinished:
            m.verdict, m.speed_only = UNDECIDED, True
            m.reason = "the budget ended before a run of it finished (raise --budget)"
        else:
            m.verdict, m.reason = "failed", "no measurement"
        return
    if base.loss_means and m.loss_means:
        b, c = statistics.fmean(base.loss_means), statistics.fmean(m.loss_means)
        spread = statistics.pstdev(base.loss_means) if len(base.loss_means) > 1 else 0.0
        tol = max(loss_rtol * abs(b), 3 * spread, 1e-6)
        if abs(c - b) > tol:
            m.verdict = "rejected"
            m.reason = f"mean loss {c:.4g} vs baseline {b:.4g}: differs by more than {tol:.3g}"
            return
    speed = engine or UNDECIDED
    if m.cannot_help:
        # the script's facts say it cannot act: whatever the runs showed is noise or a side effect
        m.verdict, m.reason = "rejected", f"did not apply: {m.cannot_help}"
        return
    m.verdict = speed
    m.speed_only = speed != HELPED
    m.reason = {
        HELPED: f"the interval lies above {1 + min_gain:.2f}x"
        if not faster_not_by_margin(m.interval, min_gain)
        else f"faster for sure: the {100 * settings.hurt_confidence:.0f}% interval lies above 1.00x when "
        f"the budget ended (a gain under {100 * min_gain:.0f}% is not excluded)",
        HURT: "the interval lies below 1.00x",
        NO_CHANGE: f"the interval lies within 1.00x \u00b1{100 * min_gain:.0f}%",
        UNDECIDED: "the budget ended before the interval decided",
    }[speed]
    if m.unfinished:
        m.reason += f"; {m.unfinished} run(s) stopped when the budget ended"
