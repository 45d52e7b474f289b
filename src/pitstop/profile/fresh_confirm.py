"""Predictions that would warn, timed again in fresh runs of the script with the fix injected.

A warning is a promise that the fix saves its share of the step. Three kinds of prediction cannot keep
that promise from the profiled process alone, so when one of them would be a warning, the script is run
again in fresh child processes, as it is vs with the finding's fix (``pitstop.profile.fresh_runs``), and
the finding is judged by that interval:

- the page faults (``malloc_confirm``): glibc's thresholds cannot be lowered again in the process;
- the data wait (``workers_confirm``): DataLoader workers compete with the compute for the cores;
- the model probes whose fix ``pitstop fix`` injects (autocast, channels_last, float32;
  ``MODEL_PROBES``): they time forward+backward of the last batch, interleaved in one warm process, and their interval covers
  that probe's spread, not what a fresh run of the whole step gains. On the calibration scripts
  (benchmarks/results/calibration.md, a Sapphire Rapids Xeon) the autocast probe predicted 1.39-2.04x
  where the fix measured 1.19-1.56x. The fresh runs' record lands in the probe's record as
  ``two_process``; ``pitstop.profile.confirm`` prefers it to the in-process interval, and when the runs
  measured nothing (the script failed with the fix, the budget ran out) the finding stays info, saying
  why. Slow steps get shorter runs and a budget scaled with the step (``run_shape``, capped), and
  where still fewer than two rounds fit, the steps inside the runs give an interval that decides only
  where the in-process probe's interval agrees (``confirm``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from pitstop.findings import Severity
from pitstop.measure import budget_for_rounds
from pitstop.profile import malloc_confirm, workers_confirm
from pitstop.profile.fresh_runs import WARMUP, Runner, timed
from pitstop.profile.overrides import Overrides
from pitstop.profile.runner import RunResult, RunSpec, run
from pitstop.recipes import recipe

# recipes whose probe predictions are timed in fresh runs
MODEL_PROBES = ("amp", "channels_last", "float32")
# per child run up to 20 steps (+3 warm-up); from round 3 a decided interval ends the runs early
STEPS, MIN_ROUNDS, MAX_ROUNDS, BUDGET_S = 20, 3, 6, 60.0
# slow steps: fewer steps a run (a run's measured part about RUN_MEASURED_S, at least MIN_STEPS) and a
# budget that holds MIN_ROUNDS rounds, at most BUDGET_CAP_S; IMPORT_S: a child's start before the script
MIN_STEPS, RUN_MEASURED_S, BUDGET_CAP_S, IMPORT_S = 6, 6.0, 120.0, 3.0

Say = Callable[[str], None]


def fix_overrides(name: str, probe: dict[str, Any], base: Overrides | None = None) -> Overrides:
    """``base`` (default: none) with what ``pitstop fix`` injects for recipe ``name`` (a field of
    ``Overrides``), the probe's dtype for autocast."""
    return replace(
        base or Overrides(), **{recipe(name).override or "": probe.get("dtype") if name == "amp" else True}
    )


def model_probes_to_time(result: RunResult) -> list[str]:
    """The ``MODEL_PROBES`` whose finding in ``result`` is a warning by its in-process interval."""
    from pitstop.profile.rules import problem_findings

    probes = result.data.get("probes") or {}
    wanted = [n for n in MODEL_PROBES if "two_process" not in (probes.get(recipe(n).probe or "") or {})]
    if not result.ok or not wanted:
        return []
    found, _ = problem_findings(result.steps, result.data)  # the warnings: no verdict needed
    warned = {f.id for f in found if f.severity.rank >= Severity.WARN.rank}
    return [n for n in wanted if recipe(n).finding in warned]


def run_shape(result: RunResult) -> tuple[int, float]:
    """Measured steps per child run and the fresh runs' budget for the profiled ``result``: ``STEPS``
    and ``BUDGET_S`` for quick steps; for slow ones fewer steps a run (about ``RUN_MEASURED_S`` of them,
    at least ``MIN_STEPS``) and a budget scaled with the step so that ``MIN_ROUNDS`` rounds fit, at most
    ``BUDGET_CAP_S``. A child's start-up is read off the profiled run (its first step's start, plus
    ``IMPORT_S`` for torch's import)."""
    step = result.median_step_s() or 0.0
    if step <= 0:
        return STEPS, BUDGET_S
    steps = max(MIN_STEPS, min(STEPS, round(RUN_MEASURED_S / step)))
    first = (result.warmup_steps or result.steps)[0].start_s if result.steps else 0.0
    run_s = IMPORT_S + max(0.0, first) + (steps + WARMUP) * step
    return steps, budget_for_rounds(2 * run_s, MIN_ROUNDS, BUDGET_S, BUDGET_CAP_S)


def time_model_probe(spec: RunSpec, result: RunResult, name: str, runner: Runner = run) -> dict[str, Any]:
    """Fresh runs of ``spec``'s script, as it is vs with recipe ``name``'s fix, shaped by ``run_shape``;
    the record is stored in the probe's record as ``two_process`` and returned."""
    probe = result.data["probes"][recipe(name).probe]

    def fixed(s: RunSpec) -> RunSpec:
        return replace(s, overrides=fix_overrides(name, probe, s.overrides))

    steps, budget = run_shape(result)
    record = timed(
        spec, fixed, runner, budget_s=budget, steps=steps, rounds=MAX_ROUNDS, min_rounds=MIN_ROUNDS
    )
    variant = fix_overrides(name, probe).describe()
    probe["two_process"] = {**record, "variant": variant, "steps": steps, "budget_scaled": budget > BUDGET_S}
    return probe["two_process"]


def confirm_all(spec: RunSpec, result: RunResult, runner: Runner = run, say: Say | None = None) -> list[str]:
    """Every fresh-run timing ``result``'s would-be warnings call for; the names of those that ran."""
    ran: list[str] = []
    if not result.ok:
        return ran
    if malloc_confirm.worth_confirming(result):
        if say:
            say(f"timing the page-fault fix in fresh runs (at most {malloc_confirm.BUDGET_S:.0f} s)")
        if malloc_confirm.maybe_confirm(spec, result, runner):
            ran.append("host_memory")
    if workers_confirm.worth_confirming(result):
        if say:
            say(f"timing the DataLoader workers fix in fresh runs (at most {workers_confirm.BUDGET_S:.0f} s)")
        if workers_confirm.maybe_confirm(spec, result, runner):
            ran.append("workers")
    for name in model_probes_to_time(result):
        if say:
            steps, budget = run_shape(result)
            say(
                f"timing the {recipe(name).title} fix in fresh runs of {steps} steps (at most {budget:.0f} s)"
            )
        time_model_probe(spec, result, name, runner)
        ran.append(name)
    return ran
