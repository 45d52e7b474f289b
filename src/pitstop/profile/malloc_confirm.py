"""The page-fault prediction confirmed in two fresh processes: the script as it is, and under glibc's env.

The in-process malloc probe runs before then after (the thresholds cannot be lowered again), so whatever
warms up in between counts as saving and it has no interval. When that prediction would be a warning,
the script is run again in fresh child processes, alternating plain and ``GLIBC_ENV``
(``MALLOC_MMAP_THRESHOLD_``/``MALLOC_TRIM_THRESHOLD_``) in rotating rounds of a few steps each, within
``BUDGET_S``; the per-step times go through ``pitstop.measure``. The result lands in the host-memory
probe's record as ``two_process`` (base_s, new_s, saving_s and, from at least two rounds, the saving's
95% bounds), which ``pitstop.profile.confirm`` judges the finding by.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from pitstop.findings import Severity
from pitstop.measure import Arm, Settings, interleave
from pitstop.profile.runner import RunResult, RunSpec, run
from pitstop.profile.timeline import breakdown
from pitstop.train.host_memory import GLIBC_ENV

BUDGET_S = 30.0  # wall time for all the child runs together
STEPS, WARMUP = 10, 3  # per child run
MAX_ROUNDS = 4

Runner = Callable[[RunSpec], RunResult]


def worth_confirming(result: RunResult) -> bool:
    """The run's host-memory probe predicts a warning (what ``host_memory_rules`` makes of it)."""
    from pitstop.profile.rules_compute import host_memory_rules

    probes = result.data.get("probes") or {}
    hm = probes.get("host_memory") or {}
    bd = breakdown(result.steps)
    if bd is None or "saving_s" not in hm or hm.get("kept") or "two_process" in hm:
        return False
    return any(f.severity is Severity.WARN for f in host_memory_rules(bd, probes))


def two_process(
    spec: RunSpec,
    runner: Runner = run,
    budget_s: float = BUDGET_S,
    clock: Callable[[], float] = time.monotonic,
) -> dict[str, Any]:
    """Rotating rounds of fresh runs of ``spec``'s script, plain vs ``GLIBC_ENV``; their saving."""
    from pitstop.profile.probes import Timed, saving

    plain, kept = Arm("plain"), Arm("glibc")
    start = clock()
    errors: list[str] = []

    def sample(name: str) -> list[float] | None:
        env = {**spec.env, **(GLIBC_ENV if name == "glibc" else {})}
        left = max(5.0, budget_s - (clock() - start))
        r = runner(
            replace(
                spec,
                steps=STEPS,
                warmup=WARMUP,
                full=False,
                trace=False,
                probes=False,
                quiet=True,
                env=env,
                timeout=min(left, spec.timeout or left),
            )
        )
        if not r.ok or not r.steps:
            errors.append(r.error or f"run ended with status {r.status}")
            return None
        return [s.total_s for s in r.steps if not s.eval]

    try:
        interleave(
            plain,
            [kept],
            sample,
            Settings(budget_s=budget_s, min_rounds=MAX_ROUNDS, max_rounds=MAX_ROUNDS),
            clock=clock,
        )
    except KeyboardInterrupt:
        errors.append("interrupted")
    out: dict[str, Any] = {
        "rounds": sum(1 for b, c in zip(plain.rounds, kept.rounds, strict=False) if b and c),
        "steps_each_side": [plain.steps, kept.steps],
        "budget_s": budget_s,
        "env": dict(GLIBC_ENV),
    }
    if errors:
        out["errors"] = errors
    base = [v for r in plain.rounds for v in r]
    new = [v for r in kept.rounds for v in r]
    if base and new:
        t = Timed(
            {"plain": statistics.median(base), "glibc": statistics.median(new)}, {"glibc": kept.interval}
        )
        out.update(saving(t, "plain", "glibc"))
    return out


def maybe_confirm(spec: RunSpec, result: RunResult, runner: Runner = run) -> bool:
    """Add the two-process measurement to ``result``'s host-memory probe when its prediction would be
    a warning; True when it ran."""
    if not spec.probes or not result.ok or not worth_confirming(result):
        return False
    result.data["probes"]["host_memory"]["two_process"] = two_process(spec, runner)
    return True
