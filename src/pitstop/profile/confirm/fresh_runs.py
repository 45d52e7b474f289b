"""A prediction timed in fresh runs of the script: as it is vs with its fix, in interleaved rounds.

Some fixes cannot be timed inside the profiled process: glibc's malloc thresholds cannot be lowered
again once raised, and DataLoader workers change which processes share the cores. Such a prediction
is timed again in fresh child processes of the script, alternating the script as it is and the
script with ``variant`` applied to its ``RunSpec`` (an env, ``Overrides``), in rotating rounds of a few
steps each within ``budget_s``, ended early from round ``MIN_ROUNDS`` on once the speed-up's interval
decides; the per-step times go through ``pitstop.measure``. The record gives base_s, new_s, saving_s
and, from at least two rounds, the speed-up's interval and the saving's 95% bounds
(``pitstop.profile.probe.probe_kit.saving``), the same from blocks of steps within the runs
(``blocks_saving``), the throughput speed-up with its interval (``throughput``:
``pitstop.measure.throughput``), or ``errors`` saying why a run measured nothing. Ctrl-C or SIGTERM stops
the runs at once: ``Interrupted`` carries the record of the rounds measured before it.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from pitstop.measure import Arm, Settings, interleave
from pitstop.measure.throughput import arm_windows, throughput_interval
from pitstop.measure.within_runs import within_runs_interval
from pitstop.profile.runs.runner import RunResult, RunSpec, run, stop_on_interrupt

BUDGET_S = 30.0  # wall time for all the child runs together
STEPS, WARMUP = 10, 3  # per child run
MAX_ROUNDS = 4
# from this round a decided interval ends the runs early: the measure's first look, as in pitstop fix
MIN_ROUNDS = Settings().min_rounds

Runner = Callable[[RunSpec], RunResult]


class Interrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM during fresh runs; ``record``: what the rounds before it measured."""

    def __init__(self, record: dict[str, Any]) -> None:
        super().__init__("interrupted during fresh runs")
        self.record = record


def timed(
    spec: RunSpec,
    variant: Callable[[RunSpec], RunSpec],
    runner: Runner = run,
    budget_s: float = BUDGET_S,
    clock: Callable[[], float] = time.monotonic,
    steps: int = STEPS,
    rounds: int = MAX_ROUNDS,
    min_rounds: int = MIN_ROUNDS,
) -> dict[str, Any]:
    """Rotating rounds of fresh runs of ``spec``'s script, as it is vs ``variant(spec)``, ``steps``
    measured steps each, ``rounds`` rounds unless the budget or a verdict ends them first; their saving
    and the speed-up's verdict. ``min_rounds`` (at most ``rounds``) is the round from which a decided
    interval (``pitstop.measure.decide``) stops the runs; an undecided one runs on to ``rounds`` or the
    budget's end. Raises ``Interrupted`` (with the record so far) at Ctrl-C or SIGTERM."""
    from pitstop.profile.probe.probe_kit import Timed, saving

    plain, fixed = Arm("plain"), Arm("fixed")
    start = clock()
    errors: list[str] = []
    interrupted = False
    runner = stop_on_interrupt(runner)

    def sample(name: str) -> list[float] | None:
        left = max(5.0, budget_s - (clock() - start))
        short = replace(
            spec,
            steps=steps,
            warmup=WARMUP,
            full=False,
            trace=False,
            probes=False,
            quiet=True,
            timeout=min(left, spec.timeout or left),
        )
        r = runner(variant(short) if name == "fixed" else short)
        if not r.ok or not r.steps:
            errors.append(r.error or f"run ended with status {r.status}")
            return None
        return [s.total_s for s in r.steps if not s.eval]

    try:
        interleave(
            plain,
            [fixed],
            sample,
            Settings(budget_s=budget_s, min_rounds=min(min_rounds, rounds), max_rounds=rounds),
            clock=clock,
        )
    except KeyboardInterrupt:
        interrupted = True
        errors.append("interrupted (Ctrl-C or SIGTERM) before the runs were done")
    out: dict[str, Any] = {
        "rounds": sum(1 for b, c in zip(plain.rounds, fixed.rounds, strict=False) if b and c),
        "steps_each_side": [plain.steps, fixed.steps],
        "budget_s": budget_s,
        "verdict": fixed.verdict,
    }
    if errors:
        out["errors"] = errors
    base = [v for r in plain.rounds for v in r]
    new = [v for r in fixed.rounds for v in r]
    # the speed-up a user's timer sees: throughput over each run's measured steps, slow ones included
    tp = throughput_interval(arm_windows(plain), arm_windows(fixed))
    if tp is not None:
        out["throughput"] = tp.to_dict()
    if base and new:
        t = Timed(
            {"plain": statistics.median(base), "fixed": statistics.median(new)}, {"fixed": fixed.interval}
        )
        out.update(saving(t, "plain", "fixed"))
        out.update(blocks_saving(plain.rounds, fixed.rounds, out["base_s"]))
    if interrupted:
        out["interrupted"] = True
        raise Interrupted(out)
    return out


def blocks_saving(base: list[list[float]], cand: list[list[float]], base_s: float) -> dict[str, Any]:
    """The saving's bounds from blocks of steps within the runs (``pitstop.measure.within_runs``), for
    ``pitstop.profile.analyze.confirm`` where too few rounds fitted for an interval over rounds."""
    iv = within_runs_interval(base, cand)
    if iv is None:
        return {}
    return {
        "blocks_interval": iv.to_dict(),
        "blocks_saving_lo_s": base_s - base_s / iv.lo,
        "blocks_saving_hi_s": base_s - base_s / iv.hi,
    }
