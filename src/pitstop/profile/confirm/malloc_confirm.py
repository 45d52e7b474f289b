"""The page-fault prediction confirmed in two fresh processes: the script as it is, and under glibc's env.

The in-process malloc probe runs before then after (the thresholds cannot be lowered again), so whatever
warms up in between counts as saving and it has no interval. When that prediction would be a warning,
the script is run again in fresh child processes, alternating plain and ``GLIBC_ENV``
(``MALLOC_MMAP_THRESHOLD_``/``MALLOC_TRIM_THRESHOLD_``) in rotating rounds of a few steps each, within
``BUDGET_S``, until the interval decides (from round ``MIN_ROUNDS``) or ``MAX_ROUNDS`` are done
(``pitstop.profile.confirm.fresh_runs``). The result lands in the host-memory probe's record as
``two_process`` (base_s, new_s, saving_s and, from at least two rounds, the saving's 95% bounds), which
``pitstop.profile.analyze.confirm`` judges the finding by.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from pitstop.findings import Severity
from pitstop.profile.confirm.fresh_runs import (
    BUDGET_S,
    MAX_ROUNDS,
    MIN_ROUNDS,
    STEPS,
    Interrupted,
    Runner,
    timed,
)
from pitstop.profile.record.timeline import breakdown
from pitstop.profile.runs.runner import RunResult, RunSpec, run
from pitstop.recipes.host_memory import GLIBC_ENV

__all__ = [
    "BUDGET_S",
    "MAX_ROUNDS",
    "MIN_ROUNDS",
    "STEPS",
    "maybe_confirm",
    "two_process",
    "worth_confirming",
]


def worth_confirming(result: RunResult) -> bool:
    """The run's host-memory probe predicts a warning (what ``host_memory_rules`` makes of it)."""
    from pitstop.profile.analyze.rules_compute import host_memory_rules

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
    """Rotating rounds of fresh runs of ``spec``'s script, plain vs ``GLIBC_ENV``, until the interval
    decides (from ``MIN_ROUNDS``), ``MAX_ROUNDS`` or ``budget_s``; their saving."""

    def glibc(s: RunSpec) -> RunSpec:
        return replace(s, env={**s.env, **GLIBC_ENV})

    return {**timed(spec, glibc, runner, budget_s, clock), "env": dict(GLIBC_ENV), "variant": "glibc's env"}


def maybe_confirm(
    spec: RunSpec, result: RunResult, runner: Runner = run, budget_s: float | None = None
) -> bool:
    """Add the two-process measurement to ``result``'s host-memory probe when its prediction would be
    a warning (``budget_s``: at most this long, default ``BUDGET_S``); True when it ran."""
    if not spec.probes or not result.ok or not worth_confirming(result):
        return False
    probe = result.data["probes"]["host_memory"]
    try:
        probe["two_process"] = two_process(spec, runner, BUDGET_S if budget_s is None else budget_s)
    except Interrupted as e:  # what the rounds before Ctrl-C measured judges the finding
        probe["two_process"] = {**e.record, "env": dict(GLIBC_ENV), "variant": "glibc's env"}
        raise
    return True
