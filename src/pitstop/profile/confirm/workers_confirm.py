"""The data-wait prediction (``dataloader.workers``) confirmed in fresh runs: as it is vs the workers fix.

The workers finding predicts that loading in worker processes saves the step's data wait. On a CPU
the workers' loading competes with the compute for the same cores, so how much of the wait goes is a
property of the machine, not of the run's steps: a model of it (``pitstop.profile.analyze.wait_confirm``'s
blocks) can promise more than the fix gives. So when the prediction would be a warning, the script is
run again in fresh child processes, alternating the script as it is and the script with the finding's
fix injected (``Overrides.workers`` of ``rules.suggested_workers`` workers: what ``pitstop fix`` and
``profile --verify`` time), in rotating rounds that a decided interval ends from round ``MIN_ROUNDS``
on (``pitstop.profile.confirm.fresh_runs``). The record lands in the run's data as ``workers_two_process``; ``wait_confirm`` judges the finding by its measured interval,
and a run that measured nothing leaves the finding info, saying why.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from pitstop.findings import Severity
from pitstop.host import cpu
from pitstop.profile.confirm.fresh_runs import Interrupted, Runner, timed
from pitstop.profile.record.overrides import Overrides
from pitstop.profile.record.timeline import breakdown
from pitstop.profile.runs.runner import RunResult, RunSpec, run
from pitstop.recipes import recipe

KEY = "workers_two_process"  # where the record goes in the run's data
# per child run: enough steps that the batches the workers prefetch during the warm-up do not make the
# median (a short run flatters the fix); a budget that holds the rounds an interval needs
STEPS, BUDGET_S = 20, 90.0


def worth_confirming(result: RunResult, cores: int | None = None) -> bool:
    """The run's data wait predicts a workers warning (what ``dataloader_rules`` makes of it)."""
    from pitstop.profile.analyze.rules import dataloader_rules

    bd = breakdown(result.steps)
    if bd is None or KEY in result.data:
        return False
    n = cores if cores is not None else cpu.usable_cores()
    found = dataloader_rules(bd, result.data.get("loaders") or [], n, result.data.get("device"), result.data)
    return any(f.id == recipe("workers").finding and f.severity.rank >= Severity.WARN.rank for f in found)


def two_process(
    spec: RunSpec, workers: int, runner: Runner = run, budget_s: float = BUDGET_S
) -> dict[str, Any]:
    """Fresh runs of ``spec``'s script, as it is vs with ``workers`` persistent DataLoader workers, until
    the interval decides (from ``fresh_runs.MIN_ROUNDS``), ``fresh_runs.MAX_ROUNDS`` or ``budget_s``."""

    def fixed(s: RunSpec) -> RunSpec:
        return replace(
            s,
            overrides=replace(
                s.overrides, dataloader={**s.overrides.dataloader, **Overrides.workers(workers).dataloader}
            ),
        )

    return {**timed(spec, fixed, runner, budget_s=budget_s, steps=STEPS), "num_workers": workers}


def maybe_confirm(
    spec: RunSpec,
    result: RunResult,
    runner: Runner = run,
    cores: int | None = None,
    budget_s: float | None = None,
) -> bool:
    """Add the fresh-run measurement of the workers fix to ``result`` when the prediction would be a
    warning (``budget_s``: at most this long, default ``BUDGET_S``); True when it ran."""
    if not result.ok or not worth_confirming(result, cores):
        return False
    from pitstop.profile.analyze.rules import suggested_workers

    n = cores if cores is not None else cpu.usable_cores()
    workers = suggested_workers(n, result.data)
    try:
        result.data[KEY] = two_process(spec, workers, runner, BUDGET_S if budget_s is None else budget_s)
    except Interrupted as e:  # what the rounds before Ctrl-C measured judges the finding
        result.data[KEY] = {**e.record, "num_workers": workers}
        raise
    return True
