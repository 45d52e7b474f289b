"""`pitstop fix --apply`'s check: the patched script run once, as it is, against the interval fix measured."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pitstop.fix.core import FixConfig, FixResult
from pitstop.fix.dist import job_runner
from pitstop.measure.throughput import arm_windows, pooled, window
from pitstop.profile.runs.runner import RunResult, RunSpec, run


@dataclass
class Verification:
    speedup: float | None
    inside: bool | None  # None: no interval to compare with
    text: str
    error: str | None = None


def verify(
    result: FixResult, cfg: FixConfig, runner: Callable[[RunSpec], RunResult] | None = None
) -> Verification:
    """Run the patched script once, unmodified by pitstop, and compare its speed-up in throughput over
    the baseline's runs (steps per wall-clock second, every measured step) with the interval fix
    measured for the recommendation."""
    runner = job_runner(runner or run)  # a launch: the slowest rank's steps, as fix judged them
    r = runner(
        RunSpec(
            command=list(result.command),
            steps=cfg.steps or result.settings.get("steps") or 20,
            warmup=cfg.warmup,
            timeout=cfg.timeout,
            cwd=cfg.cwd,
            env=dict(cfg.env),
            probes=False,
            quiet=True,
        )
    )
    if not r.ok or not r.steps:
        err = r.error or f"the patched script ended with status {r.status}"
        return Verification(None, None, f"the patched script did not run: {err}", err)
    # throughput, as fix judged: every measured step of the run, over the baseline's runs' windows
    patched = window([s.total_s for s in r.steps]).rate
    base = pooled(arm_windows(result.baseline.arm)).rate
    if not patched or not base:
        return Verification(None, None, "no step to compare")
    s = patched / base
    iv = result.interval
    if iv is None:
        return Verification(s, None, f"the patched script runs: {s:.2f}x the baseline in one run")
    inside = iv.lo <= s <= iv.hi
    where = "inside" if inside else "outside"
    return Verification(s, inside, f"the patched script runs: {s:.2f}x in one run, {where} {iv.text()}")
