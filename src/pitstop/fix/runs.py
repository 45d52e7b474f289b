"""`pitstop fix`'s orchestration: profile, rounds of child runs judged by the timing engine, combination.

1. Profile the script once; its findings pick the candidates (``pitstop.fix.core``), or ``--candidates``
   names them (then the first baseline run is round 1's baseline).
2. Rotating rounds of the baseline and every open candidate, each run a bounded number of steps, until
   every candidate's throughput is decided (``pitstop.measure.throughput``) or its share of ``--budget``
   is spent.
3. While the script waits for data, a compute fix cannot show. So when a loader fix helped, the compute
   candidates judged on speed alone (and those the profile measured a small gain for) are measured again
   with it in place, against the loader fix alone.
4. The fixes that helped (one num_workers value, ``recipes.workers``' pick from the measured ones, and
   the second round's) are combined and measured against the baseline again, interleaved with the best
   single fix in the same rounds. If the combination's speed-up is below that single fix's there, the
   single fix is kept.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from pitstop.fix import dist
from pitstop.fix.apply import plan
from pitstop.fix.core import (
    LOADER_KINDS,
    FixConfig,
    FixResult,
    build_candidates,
    hidden_kinds,
    kinds_from_findings,
    loader_of,
    merge,
)
from pitstop.fix.judge import HELPED, UNDECIDED, Measured, judge
from pitstop.fix.patch import dataloader_patch
from pitstop.host.cpu import usable_cores
from pitstop.measure import Progress, Settings, interleave
from pitstop.measure.plan import log_spread, steps_for_startup
from pitstop.measure.throughput import rejudge_throughput
from pitstop.profile.record.overrides import Overrides
from pitstop.profile.runs.runner import RunResult, RunSpec, run, stop_on_interrupt
from pitstop.recipes.workers import WorkerMachine, choose_workers

Runner = Callable[[RunSpec], RunResult]
# Shares of what is left of the budget that the first stage may use once a later stage is sure to follow
# (a loader fix or two fixes helped), and that the second stage may use.
FIRST_SHARE, SECOND_SHARE = 0.6, 0.6
MIN_RUN_S = 30.0  # a run gets at least this long even when the budget is nearly spent
FIRST_STEPS = 20  # timed steps of the runs before the start-up cost is known (``FixConfig.steps`` None)


def steps_from_run(r: RunResult) -> int | None:
    """Timed steps per run for this script from one baseline run: ``measure.plan.steps_for_startup`` of its
    start-up (wall time less its steps and probes: import, data, model, and the tail after the last
    step), its median step and its within-run spread; at most the steps the script ran when it ended
    early."""
    times = [s.total_s for s in r.steps if not s.eval]
    if not r.ok or len(times) < 3:
        return None
    step = statistics.median(times)
    steps_s = sum(s.total_s for s in [*r.warmup_steps, *r.steps])
    startup = r.wall_s - steps_s - float(r.data.get("probes_s") or 0.0)  # a profile run's probes too
    m = steps_for_startup(startup, step, step_spread=max(log_spread(times), 0.02))
    ended_early = r.spec is not None and len(r.steps) < r.spec.steps
    return min(m, len(r.steps)) if ended_early else m


def _spec(
    command: list[str], cfg: FixConfig, overrides: Overrides, probes: bool = False, steps: int | None = None
) -> RunSpec:
    return RunSpec(
        command=list(command),
        steps=steps or cfg.steps or FIRST_STEPS,
        warmup=cfg.warmup,
        timeout=cfg.timeout,
        overrides=overrides,
        cwd=cfg.cwd,
        env=dict(cfg.env),
        probes=probes,
        quiet=True,
    )


class _Rounds:
    """Runs stages of interleaved rounds inside one deadline."""

    def __init__(
        self,
        command: list[str],
        cfg: FixConfig,
        runner: Runner,
        progress: Callable[[str], None] | None,
        clock: Callable[[], float],
    ) -> None:
        self.command, self.cfg, self.runner, self.progress, self.clock = command, cfg, runner, progress, clock
        self.deadline = clock() + cfg.budget
        self.steps = cfg.steps  # None until a baseline run gave the start-up cost

    def note_baseline(self, r: RunResult) -> None:
        """With ``FixConfig.steps`` None, the first baseline run sets the steps of every later run."""
        if self.steps is None:
            self.steps = steps_from_run(r) or FIRST_STEPS
            if self.progress:
                self.progress(f"{self.steps} timed steps per run (from the baseline's start-up and step)")

    def left(self) -> float:
        return max(0.0, self.deadline - self.clock())

    def stage(
        self,
        label: str,
        configs: list[tuple[Measured, Overrides]],
        share: float = 1.0,
        reserve: Callable[[], bool] | None = None,
    ) -> None:
        """Rounds over ``configs`` (the first is the reference) for ``share`` of the budget left; with
        ``reserve``, for all of it until ``reserve()`` says a later stage needs the rest."""
        cfg = self.cfg
        start, left = self.clock(), self.left()
        by_name = {m.name: (m, ov) for m, ov in configs}
        base, arms = configs[0][0], [m for m, _ in configs[1:]]
        runs = [0]

        def sample(name: str) -> list[float] | None:
            m, ov = by_name[name]
            runs[0] += 1
            if self.progress:
                self.progress(f"{label}: run {runs[0]}, {m.name} ({self.left():.0f} s of budget left)")
            spec = _spec(self.command, cfg, ov, steps=self.steps)
            # no run outlives the budget by much: one still going when it ends is stopped
            spec.timeout = min(cfg.timeout or math.inf, max(MIN_RUN_S, self.left()))
            r = self.runner(spec)
            if r.status == "timeout" and spec.timeout < (cfg.timeout or math.inf):
                m.unfinished += 1  # stopped by the budget, not by the script: no sample, no error
                return None
            times = m.add(r)
            if m is base and times:
                self.note_baseline(r)
            if m is not base and m.blocked(bool(times)):
                m.arm.verdict = m.blocked(bool(times))  # measured enough: it cannot pass whatever its speed
            return times

        def report(p: Progress) -> None:
            # the engine decided on medians; the verdict that stops an arm is its throughput's
            rejudge_throughput(base.arm, [m.arm for m in arms], settings, p.round)
            p.verdicts = {m.arm.name: m.arm.verdict for m in arms}
            if self.progress:
                self.progress(f"{label}: {p.text()}")

        def should_stop() -> bool:
            return reserve is not None and reserve() and self.clock() - start > share * left

        settings = Settings(
            budget_s=left if reserve is not None else left * share,
            min_rounds=cfg.min_rounds,
            max_rounds=cfg.max_rounds,
            min_gain=cfg.min_gain,
        )
        interleave(
            base.arm,
            [m.arm for m in arms],
            sample,
            settings,
            clock=self.clock,
            on_progress=report,
            should_stop=should_stop,
        )
        judge(base, base, cfg)
        for m in arms:
            judge(m, base, cfg)


def run_fix(
    command: list[str],
    cfg: FixConfig | None = None,
    *,
    runner: Runner | None = None,
    progress: Callable[[str], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> FixResult:
    """Measure the candidate fixes for ``command`` within ``cfg.budget`` seconds; ``runner`` replaces
    ``pitstop.profile.runs.runner.run`` in tests. Ctrl-C or SIGTERM stops the measuring (the run in progress
    too) and reports what was measured."""
    cfg = cfg or FixConfig()
    runner = stop_on_interrupt(dist.job_runner(runner or run))  # launches: the slowest rank's steps
    rounds = _Rounds(command, cfg, runner, progress, clock)
    base = Measured("baseline (your script as it is)", "baseline", {}, verdict="baseline")
    result = FixResult(command=list(command), baseline=base)
    result.settings = {k: v for k, v in asdict(cfg).items() if k != "env"}
    try:
        started = _first_run(command, cfg, runner, rounds, result, progress)
        if started is None:
            return _finish(result, cfg, rounds.steps)
        first, kinds, hidden = started
        user_skipped = [
            f"{k}: skipped as asked (--skip), suggested by {why}" for k, why in kinds if k in cfg.skip
        ]
        kinds = [(k, why) for k, why in kinds if k not in cfg.skip]
        cands, skipped = build_candidates(kinds, result.config, cfg, result.run_data, result.profile_findings)
        result.skipped_candidates = user_skipped + skipped
        measured = [
            Measured(c.name, c.kind, c.overrides.to_dict(), c.why, cannot_help=c.cannot_help) for c in cands
        ]
        result.candidates = measured
        _say_estimate(first, len(cands), rounds, progress)
        _measure_candidates(cands, measured, base, rounds, cfg)
        if not any(base.arm.rounds):
            result.baseline_error = base.errors[0] if base.errors else "the baseline never ran a step"
            return _finish(result, cfg, rounds.steps)
        _choose(measured, hidden, rounds, result, cfg)
    except KeyboardInterrupt:
        _judge_interrupted(result, cfg)
    return _finish(result, cfg, rounds.steps)


def _first_run(
    command: list[str],
    cfg: FixConfig,
    runner: Runner,
    rounds: _Rounds,
    result: FixResult,
    progress: Callable[[str], None] | None,
) -> tuple[RunResult, list[tuple[str, str]], list[tuple[str, str]]] | None:
    """The script's first run: a profile whose findings suggest the candidates (and the kinds a loader
    fix may reveal), or, with candidates asked for, a first baseline round. Returns that run, the
    candidate kinds with why, and the hidden kinds; None (``result.baseline_error`` set) when the script
    did not run a step."""
    base = result.baseline
    if cfg.candidates is None:
        if progress:
            progress("profiling the script to choose candidates")
        first = runner(_spec(command, cfg, Overrides(), probes=True))
        if not first.ok or not first.steps:
            result.baseline_error = first.error or f"the script ended with status {first.status}"
            base.errors.append(result.baseline_error)
            return None
        result.config, result.run_data = first.config, first.data
        result.profile_findings = first.report().findings
        kinds = kinds_from_findings(result.profile_findings)
        return first, kinds, hidden_kinds(result.profile_findings, [k for k, _ in kinds])
    if progress:
        progress("baseline run")
    first = runner(_spec(command, cfg, Overrides()))
    base.record(first)
    rounds.note_baseline(first)
    if not first.ok or not first.steps:
        result.baseline_error = first.error or f"the script ended with status {first.status}"
        return None
    result.config, result.run_data = first.config, first.data
    return first, [(k, "requested") for k in cfg.candidates], []


def _measure_candidates(
    cands: list[Any], measured: list[Measured], base: Measured, rounds: _Rounds, cfg: FixConfig
) -> None:
    """The first stage: every candidate interleaved with the baseline, keeping budget for a later stage
    once one will follow (two fixes or a loader fix helped); only the baseline judged without any."""

    def later_stage_follows() -> bool:
        won = [m for m in measured if m.arm.verdict == HELPED]
        return len(won) > 1 or any(m.kind in LOADER_KINDS for m in won)

    if cands:
        configs = [(base, Overrides()), *((m, c.overrides) for m, c in zip(measured, cands, strict=True))]
        rounds.stage("candidates", configs, FIRST_SHARE, reserve=later_stage_follows)
    else:
        judge(base, base, cfg)


def _choose(
    measured: list[Measured],
    hidden: list[tuple[str, str]],
    rounds: _Rounds,
    result: FixResult,
    cfg: FixConfig,
) -> None:
    """The fixes that helped, one worker count among them, plus what helped on top of a loader fix;
    one is chosen as is, several are measured combined."""
    helped = [m for m in measured if m.verdict == HELPED]
    workers = [m for m in helped if m.kind == "workers"]
    if len(workers) > 1:  # one num_workers value: recipes.workers' pick from the measured curve
        best_w = _workers_pick(workers, result, cfg)
        helped = [m for m in helped if m.kind != "workers" or m is best_w]
    later = build_candidates(
        [(k, w) for k, w in hidden if k not in cfg.skip],
        result.config,
        cfg,
        result.run_data,
        result.profile_findings,
    )[0]
    helped += _on_top_of_loader_fix(helped, measured, later, rounds, result)
    if len(helped) == 1:
        result.chosen, result.speedup = [helped[0].name], helped[0].speedup
        result.interval = helped[0].interval if not helped[0].on_top_of else None
    elif len(helped) > 1:
        _combine(helped, result.baseline, rounds, result)


def _say_estimate(
    r: RunResult, candidates: int, rounds: _Rounds, progress: Callable[[str], None] | None
) -> None:
    """``estimate``'s line, from the first run of the script, once the candidates are known."""
    from pitstop.fix.estimate import estimate

    cfg = rounds.cfg
    steps = rounds.steps or steps_from_run(r) or FIRST_STEPS
    elapsed = cfg.budget - rounds.left()
    est = estimate(r, candidates, cfg.warmup, steps, cfg.min_rounds, cfg.budget, elapsed)
    if progress and est is not None and candidates:
        progress(est.text())


def _workers_pick(workers: list[Measured], result: FixResult, cfg: FixConfig) -> Measured:
    """The num_workers value ``recipes.workers.choose_workers`` picks from the measured throughput of the
    values that helped (the fewest workers within ``min_gain`` of the fastest, at most the cap)."""
    by_count = {int((m.overrides.get("dataloader") or {})["num_workers"]): m for m in workers}
    machine = WorkerMachine.of_run(result.run_data, usable_cores())
    choice = choose_workers(machine, {w: m.speedup or 0.0 for w, m in by_count.items()}, cfg.min_gain)
    return by_count.get(choice.workers) or max(workers, key=lambda m: m.speedup or 0.0)


def _judge_interrupted(result: FixResult, cfg: FixConfig) -> None:
    """The verdicts of the runs measured before Ctrl-C or SIGTERM; a candidate that never ran is
    undecided, not failed."""
    result.interrupted = True
    judge(result.baseline, result.baseline, cfg)
    for m in result.candidates:
        judge(m, result.baseline, cfg)
        if m.verdict == "failed" and not m.errors:
            m.verdict, m.reason = UNDECIDED, "not measured: interrupted (Ctrl-C or SIGTERM) before its runs"


def _combine(helped: list[Measured], base: Measured, rounds: _Rounds, result: FixResult) -> None:
    """The combination and the best single fix in the same rounds against the script as it is, so the
    choice between them is made on runs taken side by side. (Second-round speed-ups are over the loader
    fix: not comparable, so never the single fix.)"""
    ov = merge([Overrides.from_dict(m.overrides) for m in helped])
    comb = Measured(" + ".join(m.name for m in helped), "combined", ov.to_dict(), "the fixes that helped")
    result.combined = comb
    best = max((m for m in helped if not m.on_top_of), key=lambda m: m.speedup or 0.0)
    single = Measured(best.name, best.kind, best.overrides, best.why)
    rebase = Measured(base.name, "baseline", {})
    rounds.stage(
        "combination", [(rebase, Overrides()), (single, Overrides.from_dict(best.overrides)), (comb, ov)]
    )
    result.final_single = single
    if comb.speedup and not comb.errors and comb.speedup >= (single.speedup or 0.0):
        result.chosen, result.speedup, result.interval = [m.name for m in helped], comb.speedup, comb.interval
    else:
        result.chosen = [best.name]
        result.speedup = single.speedup or best.speedup
        result.interval = single.interval or best.interval


def _on_top_of_loader_fix(
    helped: list[Measured],
    measured: list[Measured],
    later: list[Any],
    rounds: _Rounds,
    result: FixResult,
) -> list[Measured]:
    """Second round. While the script waits for data, a compute fix (autocast, channels_last, ...) cannot
    show: the step is as long as the data wait. When a loader fix helped, the compute candidates judged
    on speed alone (not failed, not a loss change) are measured again with the loader fix in place,
    against the loader fix alone, with ``later``: compute fixes whose gain the profile measured but found
    too small a share of a data-bound step to try first. Returns those that helped there."""
    first = next((m for m in helped if m.kind in LOADER_KINDS), None)
    retry = [m for m in measured if m.kind not in LOADER_KINDS and m.speed_only and m.verdict != HELPED]
    retry_kinds = {m.kind for m in retry}
    retry += [
        Measured(c.name, c.kind, c.overrides.to_dict(), c.why)
        for c in later
        if c.kind not in retry_kinds and c.kind not in LOADER_KINDS and not c.cannot_help
    ]
    if first is None or not retry:
        return []
    first_ov = Overrides.from_dict(first.overrides)
    ref = Measured(f"{first.name} alone", "baseline", first.overrides)
    tops = [
        Measured(
            m.name,
            m.kind,
            merge([first_ov, Overrides.from_dict(m.overrides)]).to_dict(),
            m.why,
            on_top_of=first.name,
        )
        for m in retry
    ]
    rounds.stage(
        f"on top of {first.name}",
        [(ref, first_ov), *((t, Overrides.from_dict(t.overrides)) for t in tops)],
        SECOND_SHARE,
    )
    for t in tops:
        t.ref_runs, t.ref_throughput, t.ref_median = list(ref.steps_per_s), ref.throughput, ref.median
    result.candidates += tops
    return [t for t in tops if t.verdict == HELPED]


def _finish(result: FixResult, cfg: FixConfig, steps: int | None) -> FixResult:
    result.settings["steps"] = steps  # as run: the start-up rule's when --steps was not given
    chosen = [m for m in result.candidates if m.name in result.chosen]
    loader_changes: dict[str, Any] = {}
    for m in chosen:
        loader_changes.update(m.overrides.get("dataloader") or {})
    where = loader_of(result.config).get("location")
    if loader_changes and where:
        try:
            result.patch = dataloader_patch(where, loader_changes, cfg.cwd)
        except ValueError as e:
            result.patch_error = str(e)
    if result.chosen:
        p = plan(result, cfg.cwd)
        result.patches, result.unplaced = p.patches, p.unplaced
    return result
