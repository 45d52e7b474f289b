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
from typing import Any

from pitstop.findings import Finding, Severity, dedupe
from pitstop.host import cpu
from pitstop.profile.analyze import (  # the rule modules: importing them registers their rules
    confirm,
    contention_rules,
    gpu_rules,
    pass_rules,
    probe_failures,
    rules_compute,
    rules_progress,
    summary,
    wait_confirm,
)
from pitstop.profile.analyze.registry import RunView, rule, run_rules
from pitstop.profile.analyze.rulekit import MEASURES, MIN_SHARE, WARN_SHARE, bounded, cost, ms, pct, sev
from pitstop.profile.record.measurements import LoaderRecord, Measurements, SyncSite
from pitstop.profile.record.timeline import PART_LABELS, Breakdown, StepRecord, breakdown, usable_steps
from pitstop.recipes import recipe
from pitstop.recipes.workers import WorkerMachine, choose_workers

# the modules whose rules register themselves on import (``registry.rule``)
RULE_MODULES = (contention_rules, pass_rules, probe_failures, rules_compute, rules_progress)
Data = Measurements | Mapping[str, Any]  # a run's record, typed or as the child wrote it

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
    """Data-wait findings; ``data``: the run's data (its measured other load, its ranks), for the
    worker count."""
    used = [r for r in map(LoaderRecord.of, loaders) if r.batches_seen]
    if not used:
        return []
    # the loader the step waited on most speaks for the run's worker count and pinning
    main = max(used, key=lambda ld: ld.wait_s or 0.0)
    out = _data_wait_findings(bd, main.to_json(), cores, device, _as_json(data))
    if device and device.startswith("cuda") and not main.pin_memory:
        out.append(_pin_memory_finding(bd, main.location))
    out.extend(f for ld in used if (f := _persistent_workers_finding(bd, ld.to_json())) is not None)
    return out


def _data_wait_findings(
    bd: Breakdown,
    main: dict[str, Any],
    cores: int,
    device: str | None,
    data: dict[str, Any] | None,
) -> list[Finding]:
    """The data-wait finding of the ``main`` loader: too few workers when the cores allow more,
    else a slow input pipeline; none while the wait is under ``WARN_SHARE`` of the step."""
    wait = bd.parts["data_wait_s"]
    share = bd.share("data_wait_s")
    if share < WARN_SHARE:
        return []
    workers = main.get("num_workers") or 0
    where = main.get("location")
    choice = choose_workers(WorkerMachine.of_run(data, cores))
    evidence = (
        f"data wait {ms(wait)} per step, {pct(share)} of the {ms(bd.total_s)} step, over {bd.n} steps; "
        f"DataLoader with num_workers={workers}, {cores} usable cores"
    )
    if workers < choice.workers:
        suggest = choice.workers
        return [
            Finding(
                id=recipe("workers").finding,
                severity=sev(share),
                title="Training waits for data: the DataLoader has fewer workers than the cores allow",
                evidence=f"{evidence}; {suggest} worker(s) suggested ({choice.basis})",
                data={
                    "data_wait_s": wait,
                    "num_workers": workers,
                    "usable_cores": cores,
                    "steps": bd.n,
                    "suggested_workers": suggest,
                    "worker_cap": choice.cap,
                },
                fix=f"Load batches in {suggest} worker processes and keep them between epochs "
                "(`pitstop tune loader` measures the best count on your data).",
                fix_code=f"DataLoader(..., num_workers={suggest}, persistent_workers=True"
                + (", pin_memory=True" if device and device.startswith("cuda") else "")
                + ")",
                location=where,
                est_saving_s=wait,
                share=share,
            )
        ]
    return [
        Finding(
            id="dataloader.slow",
            severity=sev(share),
            title="Training waits for data although the loader has the workers the cores allow",
            evidence=f"{evidence} ({choice.basis})",
            data={"data_wait_s": wait, "num_workers": workers, "usable_cores": cores, "steps": bd.n},
            fix="The input pipeline is CPU-bound: decode smaller images, move augmentation to the GPU, "
            "or pre-process once and cache the tensors.",
            location=where,
            est_saving_s=wait,
            share=share,
        )
    ]


def _pin_memory_finding(bd: Breakdown, where: str | None) -> Finding:
    """Pageable host-to-device copies: the cost is the measured copy time per step."""
    h2d = bd.parts["h2d_s"]
    saving, sh = cost(bd, h2d)
    return Finding(
        id=recipe("pin_memory").finding,
        severity=sev(sh),
        title="Batches are copied to the GPU from pageable memory",
        evidence=f"host-to-device copies block {ms(h2d)} per step ({pct(sh)}); the loader has "
        "pin_memory=False",
        data={"h2d_s": h2d},
        fix="Pin the loader's memory and copy with non_blocking=True so copies overlap compute.",
        fix_code=recipe("pin_memory").snippet,
        location=where,
        est_saving_s=saving,
        share=sh,
    )


def _persistent_workers_finding(bd: Breakdown, ld: dict[str, Any]) -> Finding | None:
    """Worker pools restarted every epoch: the first batch's extra wait spread over an epoch's
    batches; None when the loader has no workers, keeps them, or the cost is under ``MIN_SHARE``."""
    if not (ld.get("num_workers") or 0) > 0 or ld.get("persistent_workers"):
        return None
    first = ld.get("first_batch_s") or []
    per_epoch = ld.get("batches_per_epoch") or ld.get("batches_seen") or 1
    avg_wait = ld.get("wait_s", 0.0) / max(1, ld.get("batches_seen", 1))
    spawn = max(0.0, (sum(first) / len(first) if first else 0.0) - avg_wait)
    saving, sh = cost(bd, spawn / max(1, per_epoch))
    if sh < MIN_SHARE:
        return None  # long epochs amortise the restart: not worth a line
    return Finding(
        id=recipe("persistent_workers").finding,
        severity=sev(sh),
        title="DataLoader workers are started again every epoch",
        evidence=f"the first batch of a fresh worker pool waited {ms(spawn)} more than an average "
        f"batch; over {per_epoch} batches per epoch that is {ms(saving)} per step "
        f"({ld.get('iterators', 0)} worker pool(s) started in this run)",
        data={
            "first_batch_s": first,
            "batches_per_epoch": per_epoch,
            "epochs_seen": ld.get("iterators"),
        },
        fix="Keep the workers alive between epochs.",
        fix_code=recipe("persistent_workers").snippet,
        location=ld.get("location"),
        est_saving_s=saving,
        share=sh,
    )


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
    totals = m.totals if m.totals is not None else {}
    warm = sum(1 for r in m.steps or [] if isinstance(r, dict) and r.get("warmup"))
    if warm:
        what = "optimizer steps" if m.step_boundary == "optimizer.step()" else "steps"
        n = warm if m.warmup is None else m.warmup
        ended = "then it was stopped" if m.status == "interrupted" else "then the script ended"
        return Finding(
            id="profile.no_step",
            severity=Severity.WARN,
            title=f"All {warm} {what} were warm-up: none was measured",
            evidence=f"{warm} {what} seen ({totals.get('optimizer_steps', 0)} optimizer.step() calls), all "
            f"within the first {n} that --warmup leaves out of the measurement; {ended}",
            data={**totals, "warmup_steps": warm, "warmup": n},
            fix=f"Run the script longer (more batches or epochs), or lower --warmup below {warm} "
            f"(e.g. --warmup {max(0, warm - 3)}) so some steps are measured.",
        )
    return Finding(
        id="profile.no_step",
        severity=Severity.WARN,
        title="No training step was seen",
        evidence=f"{totals.get('batches', 0)} batches loaded ({totals.get('data_wait_s', 0.0):.3f} s waiting), "
        f"{totals.get('forwards', 0)} forward calls ({totals.get('forward_s', 0.0):.3f} s), "
        f"{totals.get('backwards', 0)} backward calls ({totals.get('backward_s', 0.0):.3f} s), but "
        "neither optimizer.step() nor enough backward() calls to delimit steps by "
        "(or the script stopped before them)",
        data=totals,
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
