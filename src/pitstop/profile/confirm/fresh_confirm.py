"""Predictions that would warn, timed again in fresh runs of the script with the fix injected.

A warning is a promise that the fix saves its share of the step. Three kinds of prediction cannot keep
that promise from the profiled process alone, so when one of them would be a warning, the script is run
again in fresh child processes, as it is vs with the finding's fix (``pitstop.profile.confirm.fresh_runs``), and
the finding is judged by that interval:

- the page faults (``malloc_confirm``): glibc's thresholds cannot be lowered again in the process;
- the data wait (``workers_confirm``): DataLoader workers compete with the compute for the cores;
- the model probes whose fix ``pitstop fix`` injects (autocast, channels_last, float32;
  ``MODEL_PROBES``): they time forward+backward of the last batch, interleaved in one warm process, and their interval covers
  that probe's spread, not what a fresh run of the whole step gains. On the calibration scripts
  (benchmarks/results/calibration.md, a Sapphire Rapids Xeon) the autocast probe predicted 1.39-2.04x
  where the fix measured 1.19-1.56x. The fresh runs' record lands in the probe's record as
  ``two_process``; ``pitstop.profile.analyze.confirm`` prefers it to the in-process interval, and when the runs
  measured nothing (the script failed with the fix, the budget ran out) the finding stays info, saying
  why. Slow steps get shorter runs and a budget scaled with the step (``run_shape``, capped), and
  where still fewer than two rounds fit, the steps inside the runs give an interval that decides only
  where the in-process probe's interval agrees (``confirm``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from pitstop.findings import Finding, Severity
from pitstop.host import cpu
from pitstop.measure.plan import budget_for_rounds
from pitstop.profile.confirm import budget, malloc_confirm, workers_confirm
from pitstop.profile.confirm.fresh_runs import MIN_ROUNDS, WARMUP, Interrupted, Runner, timed
from pitstop.profile.record.overrides import Overrides
from pitstop.profile.runs.runner import RunResult, RunSpec, run
from pitstop.recipes import autocast, channels_last, float32, recipe
from pitstop.recipes.host_memory import GLIBC_ENV

# recipes whose probe predictions are timed in fresh runs
MODEL_PROBES = (autocast.NAME, channels_last.NAME, float32.NAME)
# per child run up to 20 steps (+3 warm-up); from round MIN_ROUNDS (fresh_runs') a decided interval
# ends the runs early
STEPS, MAX_ROUNDS, BUDGET_S = 20, 6, 60.0
# slow steps: fewer steps a run (a run's measured part about RUN_MEASURED_S, at least MIN_STEPS) and a
# budget that holds MIN_ROUNDS rounds, at most BUDGET_CAP_S; IMPORT_S: a child's start before the script
MIN_STEPS, RUN_MEASURED_S, BUDGET_CAP_S, IMPORT_S = 6, 6.0, 120.0, 3.0

Say = Callable[[str], None]


def fix_overrides(name: str, probe: dict[str, Any], base: Overrides | None = None) -> Overrides:
    """``base`` (default: none) with what ``pitstop fix`` injects for recipe ``name`` (a field of
    ``Overrides``), the probe's dtype for autocast."""
    return replace(
        base or Overrides(), **{recipe(name).override or "": probe.get("dtype") if name == autocast.NAME else True}
    )


def model_probes_to_time(result: RunResult, found: list[Finding] | None = None) -> list[str]:
    """The ``MODEL_PROBES`` whose finding in ``result`` is a warning by its in-process interval
    (``found``: ``result``'s findings where already made)."""
    probes = result.data.get("probes") or {}
    wanted = [n for n in MODEL_PROBES if "two_process" not in (probes.get(recipe(n).probe or "") or {})]
    if not result.ok or not wanted:
        return []
    found = _findings(result) if found is None else found  # the warnings: no verdict needed
    warned = {f.id for f in found if f.severity.rank >= Severity.WARN.rank}
    return [n for n in wanted if warned.intersection(recipe(n).findings)]


def _findings(result: RunResult) -> list[Finding]:
    from pitstop.profile.analyze.rules import problem_findings

    return problem_findings(result.steps, result.measurements())[0]


def predicted_savings(found: list[Finding]) -> dict[str, float]:
    """Finding id -> the saving a step it predicts (the largest where one id comes twice)."""
    out: dict[str, float] = {}
    for f in found:
        if f.est_saving_s is not None:
            out[f.id] = max(out.get(f.id, 0.0), f.est_saving_s)
    return out


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


def time_model_probe(
    spec: RunSpec, result: RunResult, name: str, runner: Runner = run, budget_s: float | None = None
) -> dict[str, Any]:
    """Fresh runs of ``spec``'s script, as it is vs with recipe ``name``'s fix, shaped by ``run_shape``
    (``budget_s``: at most this long instead); the record is stored in the probe's record as
    ``two_process`` and returned."""
    probe = result.data["probes"][recipe(name).probe]

    def fixed(s: RunSpec) -> RunSpec:
        return replace(s, overrides=fix_overrides(name, probe, s.overrides))

    steps, budget = run_shape(result)
    budget = budget if budget_s is None else min(budget, budget_s)
    try:
        record = timed(spec, fixed, runner, budget_s=budget, steps=steps, rounds=MAX_ROUNDS)
    except Interrupted as e:  # what the rounds before Ctrl-C measured judges the finding
        probe["two_process"] = {**e.record, **_shape(result, name)}
        raise
    probe["two_process"] = {**record, **_shape(result, name)}
    return probe["two_process"]


def _shape(result: RunResult, name: str) -> dict[str, Any]:
    """What a model probe's fresh-run record says about the runs' shape."""
    steps, budget = run_shape(result)
    probe = result.data["probes"][recipe(name).probe]
    return {
        "variant": fix_overrides(name, probe).describe(),
        "steps": steps,
        "budget_scaled": budget > BUDGET_S,
    }


@dataclass
class Confirmation:
    """One fresh-run timing ``confirm_all`` may start: ``run(budget_s)`` times it; ``skipped(record)``
    stores the record of runs not started where its finding looks. ``predicted_s``: the saving a step its
    finding predicts (the order's key); ``min_rounds``: the rounds of fresh runs its verdict needs (1
    where the blocks within one round can decide with the in-process interval,
    ``analyze.confirm.agreeing_blocks``; else ``budget.INTERVAL_ROUNDS``)."""

    name: str
    title: str
    own_budget_s: float
    steps: int
    run: Callable[[float | None], Any]
    skipped: Callable[[dict[str, Any]], None]
    predicted_s: float = 0.0
    min_rounds: int = budget.INTERVAL_ROUNDS


def confirmations(spec: RunSpec, result: RunResult, runner: Runner = run) -> list[Confirmation]:
    """The fresh-run timings ``result``'s would-be warnings call for, in the order they run: the
    biggest predicted saving a step first."""
    from pitstop.profile.analyze.confirm import in_process_agrees

    out: list[Confirmation] = []
    if not result.ok:
        return out
    found = _findings(result)
    saving = predicted_savings(found)
    probes = result.data.get("probes") or {}
    if spec.probes and malloc_confirm.worth_confirming(result):
        hm = probes["host_memory"]
        out.append(
            Confirmation(
                "host_memory",
                "page-fault",
                malloc_confirm.BUDGET_S,
                malloc_confirm.STEPS,
                lambda b: malloc_confirm.maybe_confirm(spec, result, runner, budget_s=b),
                lambda rec: hm.update(two_process={**rec, "env": dict(GLIBC_ENV), "variant": "glibc's env"}),
                saving.get(recipe("host_memory").finding or "", 0.0),
            )
        )
    if workers_confirm.worth_confirming(result):
        from pitstop.profile.analyze.rules import suggested_workers

        workers = suggested_workers(cpu.usable_cores(), result.data)
        out.append(
            Confirmation(
                "workers",
                "DataLoader workers",
                workers_confirm.BUDGET_S,
                workers_confirm.STEPS,
                lambda b: workers_confirm.maybe_confirm(spec, result, runner, budget_s=b),
                lambda rec: result.data.update({workers_confirm.KEY: {**rec, "num_workers": workers}}),
                saving.get(recipe("workers").finding or "", 0.0),
            )
        )
    for name in model_probes_to_time(result, found):
        steps, own = run_shape(result)
        probe = probes[recipe(name).probe]
        out.append(
            Confirmation(
                name,
                recipe(name).title,
                own,
                steps,
                lambda b, n=name: time_model_probe(spec, result, n, runner, budget_s=b),
                lambda rec, n=name, p=probe: p.update(two_process={**rec, **_shape(result, n)}),
                max((saving.get(i, 0.0) for i in recipe(name).findings), default=0.0),
                1 if in_process_agrees(probe) else budget.INTERVAL_ROUNDS,
            )
        )
    return sorted(out, key=lambda c: -c.predicted_s)  # stable: ties keep the order above


def confirm_all(
    spec: RunSpec,
    result: RunResult,
    runner: Runner = run,
    say: Say | None = None,
    budget_s: float | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> list[str]:
    """Every fresh-run timing ``result``'s would-be warnings call for, biggest predicted saving first;
    the names of those that ran. ``budget_s`` (``pitstop.profile.confirm.budget``): the seconds the
    probes and these runs share, planned by ``budget.shares``; each runs within its planned seconds plus
    what the ones before it left unspent (``budget.runtime_share``), and one whose share does not hold
    the rounds its verdict needs is not run (its record says why). None: each its own budget. The plan
    and each one's seconds land in ``result.data["answer_time"]``. Ctrl-C or SIGTERM ends them at once
    (``fresh_runs.Interrupted``, a KeyboardInterrupt), the rounds measured before it kept in their
    finding's record."""
    todo = confirmations(spec, result, runner)
    plan = budget.Plan(budget_s, budget.stages(result), predicted_s={c.name: c.predicted_s for c in todo})
    needs = [budget.Need(c.own_budget_s, budget.round_s(result, c.steps, WARMUP), c.min_rounds) for c in todo]
    planned = [c.own_budget_s for c in todo] if budget_s is None else budget.shares(plan.left_s, needs)
    plan.planned = [(c.name, s or 0.0) for c, s in zip(todo, planned, strict=True)]
    spent: dict[str, float] = {}
    result.data["answer_time"] = {**plan.to_dict(), "confirm_spent_s": spent}
    if say and budget_s is not None:
        say(plan.text())
    ran: list[str] = []
    start = clock()
    for i, (c, need) in enumerate(zip(todo, needs, strict=True)):
        got: float | None = None
        if budget_s is not None:  # its share, plus what the ones before it left unspent
            left = plan.left_s - (clock() - start)
            got = budget.runtime_share(c.own_budget_s, left, sum(s or 0.0 for s in planned[i + 1 :]))
            if got < need.min_rounds * need.round_s:
                bigger_first = bool(ran) or any(planned[:i])  # ones before it ran or hold seconds
                c.skipped(budget.skip_record(need.round_s, got, budget_s, need.min_rounds, bigger_first))
                spent[c.name] = 0.0
                continue
        if say:
            say(
                f"timing the {c.title} fix in fresh runs of {c.steps} steps (at most {got or c.own_budget_s:.0f} s)"
            )
        t0 = clock()
        try:
            if c.run(got) is not False:
                ran.append(c.name)
        finally:
            spent[c.name] = round(clock() - t0, 2)
    return ran
