"""Measurements of one run -> ranked Findings. Pure functions: nothing here measures or prints.

Every finding's ``est_saving_s`` is what the problem measurably cost per step in this run (time waiting
for data, time blocked in syncs, the difference a probe timed on the script's own model), and ``share``
that cost over the mean step. A finding costing at least ``WARN_SHARE`` of the step is a warning; less,
or not measurable here, is info. So ``Report.ranked()`` puts the costliest measured problem first, and
a run where nothing costs that much says so (``summary.healthy``) instead of inventing a problem, or,
where estimates that large were not confirmed, that the run could not decide (``summary.unconfirmed``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

from pitstop.findings import Finding, Severity, dedupe
from pitstop.host import cpu
from pitstop.profile.analyze import (  # the rule modules: importing them registers their rules
    confirm,
    contention_rules,
    gpu_rules,
    pass_rules,
    probe_failures,
    rulekit,
    rules_compute,
    rules_progress,
    summary,
    wait_confirm,
)
from pitstop.profile.analyze.registry import RunView, rule, run_rules
from pitstop.profile.analyze.rulekit import MEASURES, bounded, cost, ms, pct, sev
from pitstop.profile.record.measurements import LoaderRecord, Measurements, SyncSite
from pitstop.profile.record.timeline import PART_LABELS, Breakdown, StepRecord, breakdown, usable_steps
from pitstop.recipes import components
from pitstop.recipes.component import LOADER
from pitstop.recipes.dataloader import LoaderRun
from pitstop.recipes.workers import WorkerMachine, choose_workers

# the modules whose rules register themselves on import (``registry.rule``)
RULE_MODULES = (contention_rules, pass_rules, probe_failures, rules_compute, rules_progress)
Data = Measurements | Mapping[str, Any]  # a run's record, typed or as the child wrote it

if TYPE_CHECKING:
    from pitstop.recipes.component import LoaderComponent

# ------------------------------------------------------------------------------------------- data


def suggested_workers(cores: int, data: Data | None = None) -> int:
    """The DataLoader worker count the workers finding suggests (``recipes.workers.choose_workers``
    without measurements)."""
    return choose_workers(WorkerMachine.of_run(_as_json(data), cores)).workers


def _as_json(data: Data | None) -> Mapping[str, Any] | None:
    return data.to_json() if isinstance(data, Measurements) else data


@rule(order=20)
def dataloader_rule(v: RunView) -> list[Finding]:
    return dataloader_rules(v.breakdown, v.m.loaders, v.cores, v.m.device, v.m)


def dataloader_rules(
    bd: Breakdown,
    loaders: Sequence[LoaderRecord | Mapping[str, Any]],
    cores: int,
    device: str | None,
    data: Data | None = None,
) -> list[Finding]:
    """Data-wait findings, each loader component's ``rules`` (``pitstop.recipes.dataloader``: workers,
    persistent workers, pinning); ``data``: the run's data (its measured other load, its ranks), for the
    worker count."""
    used = [r for r in map(LoaderRecord.of, loaders) if r.batches_seen]
    if not used:
        return []
    # the loader the step waited on most speaks for the run's worker count and pinning
    main = max(used, key=lambda ld: ld.wait_s or 0.0)
    # the loader components read the loaders as the child wrote them (they sit below profile)
    run = LoaderRun(bd, [ld.to_json() for ld in used], main.to_json(), cores, device, _as_json(data))
    return [f for comp in components(LOADER) for f in cast("LoaderComponent", comp).rules(run, rulekit)]


# -------------------------------------------------------------------------------------------- sync


@rule(order=30)
def sync_rule(v: RunView) -> list[Finding]:
    return sync_rules(v.breakdown, v.m.sync_sites, v.m.device, v.breakdown.n)


def sync_rules(
    bd: Breakdown, sites: Sequence[SyncSite | Mapping[str, Any]], device: str | None, n_steps: int
) -> list[Finding]:
    """Cost: the step's sync part, i.e. the time blocked in the calls plus, for per-element loops of them
    (syncs less than ``LOOP_GAP_S`` apart), the loop's time between the calls, which one ``.tolist()`` or
    a vectorised expression would also remove."""
    measured = [r for r in map(SyncSite.of, sites) if r.measured_count]
    if not measured or bd.syncs_per_step <= 0:
        return []
    steps = max(1, n_steps)
    per_step = {id(s): ((s.time_s or 0.0) + (s.loop_gap_s or 0.0)) / steps for s in measured}
    # costs under 10 us a step (CPU syncs: their first call's time only) are a tie: the most calls lead
    measured.sort(key=lambda s: (-round(per_step[id(s)], 5), -(s.measured_count or 0)))
    top = measured[0]
    top_count = top.measured_count or 0
    # the step's sync part already holds both: time inside the calls and the per-element loops around them
    loops = sum(s.loop_gap_s or 0.0 for s in measured) / steps
    inside = sum(s.time_s or 0.0 for s in measured) / steps
    saving, share = cost(bd, bd.parts["sync_s"])
    on_cpu = not device or device == "cpu"
    where = ", ".join(
        f"{s.location} .{(s.method or '').strip('_')}() x{(s.measured_count or 0) / steps:.3g}/step"
        for s in measured[:3]
    )
    meaning = (
        "On CPU these calls cost their own time only; on a GPU each one also stalls until the GPU catches up."
        if on_cpu
        else "Each one blocks the host until the GPU has finished all queued work."
    )
    parts = []
    if inside >= 0.00005 or loops < 0.0001:
        parts.append(f"{ms(inside)} blocked inside them")
    if loops >= 0.0001:
        parts.append(f"{ms(loops)} in the per-element loop that makes them")
    spent = " plus ".join(parts)
    if top.sampled_steps:  # the wrappers timed a sample of the steps (pitstop.profile.capture.syncs)
        spent += f", timed on {top.sampled_steps} of {top.measured_steps} measured steps and scaled"
    per_element = top_count / steps >= 8
    fix = (
        "Read the whole tensor once with `.tolist()` instead of an `.item()` per element, or keep the values "
        "on the device and read them every N steps."
        if per_element
        else "Keep values on the device and read them every N steps (each read waits for the GPU)."
    )
    code = (
        "values = tensor.detach().tolist()   # one sync instead of one per element"
        if per_element
        else "running = running + loss.detach()   # no sync\nif step % 50 == 0:\n    print(running.item() / 50)"
    )
    return [
        Finding(
            id="sync.item",
            severity=sev(share),
            title=f"{bd.syncs_per_step:.3g} host-device syncs per step (.item(), .cpu(), printing tensors ...)",
            evidence=f"{bd.syncs_per_step:.3g} syncs per step, {spent} "
            f"({pct(share)} of the step) over {bd.n} steps, from {where}. {meaning}",
            data={
                "syncs_per_step": bd.syncs_per_step,
                "sync_s": inside,
                "loop_s": loops,
                "sites": [{**s.to_json(), "cost_per_step_s": per_step[id(s)]} for s in measured[:10]],
            },
            fix=fix,
            fix_code=code,
            location=top.location,
            est_saving_s=saving,
            share=share,
        )
    ]


# -------------------------------------------------------------------------------------------- all


def findings_for(
    steps: list[StepRecord], data: Data, cores: int | None = None
) -> tuple[list[Finding], Breakdown | None]:
    """All findings for one run's measurements (``data``: the child's measurements record): its
    problems, then the run's verdict (``summary``) where nothing warns."""
    m = Measurements.of(data)
    found, bd = problem_findings(steps, m, cores)
    if bd is not None:
        last = summary.verdict(found, **verdict_basis(found, bd, m))
        found += [last] if last else []
    return found, bd


def problem_findings(
    steps: list[StepRecord], data: Data, cores: int | None = None
) -> tuple[list[Finding], Breakdown | None]:
    """The findings for one run's measurements, without the run's verdict: every registered rule
    (``registry``) in its order, then the passes over all of them (GPU, confirmation, bounds)."""
    m = Measurements.of(data)
    bd = breakdown(steps)
    view = RunView(steps, bd, m, cores if cores is not None else cpu.usable_cores())
    found = run_rules(view)
    if bd is None:
        return found, None
    dev_type = m.dev_type
    found = gpu_rules.apply(found, bd, steps, m)  # trace analysis, CUDA events, MFU, memory, GPU probes
    found = confirm.apply(found, bd)  # probe predictions: a warning only when the interval confirms it
    # the data wait's interval; the workers fix's own where fresh runs timed it (workers_confirm)
    found = wait_confirm.apply(found, usable_steps(steps), bd, dev_type, m.workers_two_process)
    # no finding saves more than the part of the step it lives in; one finding per site; each says where
    # other work used the CPUs
    return contention_rules.note_contention(dedupe(bounded(found, bd, dev_type)), m), bd


@rule(order=15, when="no_steps")
def no_step_rule(v: RunView) -> list[Finding]:
    # a CUDA OOM before the first step shows in the memory findings
    return [no_step_finding(v.m), *gpu_rules.memory_findings(v.m.memory or {})]


def no_step_finding(data: Data) -> Finding:
    """``profile.no_step``: no measured step. Either every step the script ran was a warm-up step (it
    ended too soon for ``--warmup``), or no step boundary was seen at all."""
    m = Measurements.of(data)
    t = m.run_totals
    warm = sum(1 for r in m.steps or [] if isinstance(r, dict) and r.get("warmup"))
    if warm:
        what = "optimizer steps" if m.step_boundary == "optimizer.step()" else "steps"
        n = warm if m.warmup is None else m.warmup
        ended = "then it was stopped" if m.status == "interrupted" else "then the script ended"
        return Finding(
            id="profile.no_step",
            severity=Severity.WARN,
            title=f"All {warm} {what} were warm-up: none was measured",
            evidence=f"{warm} {what} seen ({t.optimizer_steps or 0} optimizer.step() calls), all "
            f"within the first {n} that --warmup leaves out of the measurement; {ended}",
            data={**t.to_json(), "warmup_steps": warm, "warmup": n},
            fix=f"Run the script longer (more batches or epochs), or lower --warmup below {warm} "
            f"(e.g. --warmup {max(0, warm - 3)}) so some steps are measured.",
        )
    return Finding(
        id="profile.no_step",
        severity=Severity.WARN,
        title="No training step was seen",
        evidence=f"{t.batches or 0} batches loaded ({t.data_wait_s or 0.0:.3f} s waiting), "
        f"{t.forwards or 0} forward calls ({t.forward_s or 0.0:.3f} s), "
        f"{t.backwards or 0} backward calls ({t.backward_s or 0.0:.3f} s), but "
        "neither optimizer.step() nor enough backward() calls to delimit steps by "
        "(or the script stopped before them)",
        data=t.to_json(),
        fix="pitstop delimits steps by optimizer.step(), or by backward() in loops without an optimizer; "
        "profile the training script, or run longer.",
    )


def verdict_basis(found: list[Finding], bd: Breakdown, data: Data) -> dict[str, Any]:
    """``summary.basis`` of one run: what it measured, and which of its problem findings (``found``,
    no verdict among them) it could not measure."""
    unmeasured = sorted(
        {
            f.id
            for f in found
            if f.est_saving_s is None and f.severity is Severity.INFO and f.id not in MEASURES
        }
    )
    measured = (
        f"{bd.n} steps, {ms(bd.median_total_s)} median. Step: "
        + ", ".join(f"{PART_LABELS[k]} {pct(bd.share(k))}" for k in bd.parts if bd.share(k) >= 0.005)
        + (f". Not measurable in this run: {', '.join(unmeasured)} (see `pitstop fix`)" if unmeasured else "")
    )
    return summary.basis(
        "No measured problem costs 5% of the step or more",
        measured,
        Measurements.of(data).other_cpu_share,
        median_step_s=bd.median_total_s,
        steps=bd.n,
        unmeasured=unmeasured,
    )
