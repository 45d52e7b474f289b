"""Findings that compare ranks: stragglers, exposed communication, DDP settings (the step component's
rules, ``pitstop.recipes.step``), threads, backend.

Pure functions of the per-rank summaries (``record.rank_summary.RankSummary``, made by
``pitstop.profile.runs.merge.rank_summary``; a rule takes them typed or as their JSON) and the skew of the
collectives. A rank's *wait* per step is the time it spent blocked in collectives: DDP's gradient
all-reduce after its last bucket was ready, plus blocking explicit collectives and ``Work.wait``. A rank's
*busy* time is its step minus that wait: in a lockstep job every rank's step lasts as long as the slowest
one's, so the busy time is what tells the straggler apart.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from pitstop.findings import Finding, Severity
from pitstop.profile.analyze.rulekit import ms
from pitstop.profile.process.children import LAUNCHER
from pitstop.profile.record.rank_summary import RankSummary
from pitstop.profile.record.timeline import PART_LABELS
from pitstop.recipes.step import no_sync_rule, static_graph_rule

WARN_SHARE = 0.05
PHASES = ("data_wait_s", "h2d_s", "forward_s", "backward_s", "optimizer_s", "sync_s", "other_s")


Summaries = Sequence[RankSummary | Mapping[str, Any]]  # the ranks' summaries, typed or as their JSON


def _med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else 0.0


def _typed(summaries: Summaries) -> list[RankSummary]:
    return [RankSummary.of(s) for s in summaries]


def skew_summary(calls: dict[int, list[dict[str, Any]]], warmup: int) -> dict[str, Any]:
    """Per kind of collective: how far apart the ranks arrived (median and max over the measured calls)
    and which rank arrived last how often. Calls are matched across ranks by kind and sequence number."""
    by_key: dict[tuple[str, int], dict[int, float]] = defaultdict(dict)
    for rank, rows in calls.items():
        for c in rows:
            if c.get("step", 0) >= warmup:
                by_key[(c["op"], c["seq"])][rank] = c.get("last_s", c["enter_s"])
    world = len(calls)
    ops: dict[str, dict[str, Any]] = {}
    for (op, _seq), arrivals in sorted(by_key.items()):
        if len(arrivals) < max(2, world):
            continue
        last = max(arrivals, key=lambda r: arrivals[r])
        row = ops.setdefault(op, {"op": op, "calls": 0, "skews_s": [], "last_rank": defaultdict(int)})
        row["calls"] += 1
        row["skews_s"].append(arrivals[last] - min(arrivals.values()))
        row["last_rank"][last] += 1
    out = {}
    for op, row in ops.items():
        skews = row.pop("skews_s")
        out[op] = {
            **row,
            "median_skew_s": _med(skews),
            "max_skew_s": max(skews),
            "last_rank": {str(k): v for k, v in sorted(row["last_rank"].items())},
        }
    return out


def _wait(s: RankSummary) -> float:
    return s.comm_per_step.wait_s


def _phases(s: RankSummary) -> dict[str, float]:
    """Mean seconds per step of each part, with time blocked in collectives taken out."""
    bd = s.breakdown
    c = s.comm_per_step
    ph = {k: bd.part(k) if bd is not None else 0.0 for k in PHASES}
    ph["backward_s"] = max(0.0, ph["backward_s"] - c.ddp_exposed_s)
    left = c.collective_s
    for k in ("other_s", "sync_s", "forward_s", "optimizer_s"):  # where blocking collectives are counted
        take = min(ph[k], left)
        ph[k] -= take
        left -= take
    return ph


def straggler(summaries: Summaries) -> Finding | None:
    ranks = [s for s in _typed(summaries) if s.measured]
    if len(ranks) < 2:
        return None
    busy = {s.rank: s.step_s - _wait(s) for s in ranks}
    slow = max(busy, key=lambda r: busy[r])
    others = [s for s in ranks if s.rank != slow]
    s_slow = next(s for s in ranks if s.rank == slow)
    other_busy = _med([busy[s.rank] for s in others])
    excess = busy[slow] - other_busy
    step = _med([s.step_s for s in ranks])
    other_wait = _med([_wait(s) for s in others])
    if step <= 0 or excess < WARN_SHARE * step or other_wait <= _wait(s_slow):
        return None
    ph_slow = _phases(s_slow)
    ph_other = {k: _med([_phases(s)[k] for s in others]) for k in PHASES}
    phase = max(PHASES, key=lambda k: ph_slow[k] - ph_other[k])
    waits = ", ".join(f"rank {s.rank} {ms(_wait(s))}" for s in others)
    where = _wait_where(others)
    return Finding(
        id="distributed.straggler",
        severity=Severity.WARN,
        title=f"Rank {slow} is the straggler: its steps are {100 * excess / max(other_busy, 1e-9):.0f}% slower, "
        f"in {PART_LABELS[phase]}",
        evidence=f"rank {slow} busy {ms(busy[slow])} per step vs {ms(other_busy)} on the others "
        f"({PART_LABELS[phase]} {ms(ph_slow[phase])} vs {ms(ph_other[phase])}); the others wait for it in "
        f"collectives: {waits} per step{where}, over {s_slow.measured_steps} measured steps",
        data={
            "rank": slow,
            "phase": phase,
            "slower_pct": 100 * excess / max(other_busy, 1e-9),
            "busy_s": busy,
            "others_wait_s": {s.rank: _wait(s) for s in others},
            "phase_s": ph_slow[phase],
            "others_phase_s": ph_other[phase],
        },
        fix=f"Make rank {slow}'s {PART_LABELS[phase]} as fast as the others' (its data shard, its loader "
        "workers, the host or GPU it runs on); every rank runs at the pace of the slowest.",
        est_saving_s=other_wait - _wait(s_slow),
        share=min(1.0, (other_wait - _wait(s_slow)) / step),
    )


def _wait_where(others: list[RankSummary]) -> str:
    s = others[0]
    c = s.comm_per_step
    if c.ddp_exposed_s >= c.collective_s:
        loc = next((d.get("location") for d in s.ddp if d.get("location")), None)
        return " (in DDP's gradient all-reduce" + (f", model wrapped at {loc}" if loc else "") + ")"
    sites = sorted(s.collective_sites, key=lambda x: -x["time_s"])
    return f" (mostly in {sites[0]['op']} at {sites[0]['location']})" if sites else ""


def comm_exposed(summaries: Summaries) -> Finding | None:
    ranks = [s for s in _typed(summaries) if s.breakdown is not None and s.comm_per_step.ddp_rounds > 0]
    if not ranks:
        return None
    # the rank that waited least: its exposed time is communication, not waiting for a slower peer
    s = min(ranks, key=_wait)
    c = s.comm_per_step
    step = s.step_s
    exposed, total = c.ddp_exposed_s, c.ddp_comm_s
    if step <= 0 or exposed < 0.01 * step:
        return None
    share = exposed / step
    ddp = s.ddp[0] if s.ddp else {}
    return Finding(
        id="distributed.comm_exposed",
        severity=Severity.WARN if share >= WARN_SHARE else Severity.INFO,
        title=f"Gradient all-reduce not hidden behind backward: {ms(exposed)} per step",
        evidence=f"rank {s.rank}: DDP all-reduce {ms(total)} per step, {ms(exposed)} of it after the last "
        f"bucket was ready ({100 * share:.0f}% of the {ms(step)} step); {c.ddp_bytes / 2**20:.1f} MiB per step, "
        f"bucket cap {ddp.get('bucket_cap_bytes')} B, gradient_as_bucket_view={ddp.get('gradient_as_bucket_view')}, "
        f"static_graph={ddp.get('static_graph')}",
        data={"rank": s.rank, "exposed_s": exposed, "comm_s": total, "ddp": ddp},
        fix="Let communication overlap backward: smaller buckets start earlier (bucket_cap_mb), "
        "gradient_as_bucket_view=True saves a copy, static_graph=True when the graph does not change; "
        "on slow links, a compression hook (fp16/bf16_compress_hook).",
        fix_code="DDP(model, bucket_cap_mb=10, gradient_as_bucket_view=True, static_graph=True)",
        est_saving_s=exposed,
        share=share,
    )


def find_unused(summaries: list[dict[str, Any]]) -> Finding | None:
    """DDP's search for unused parameters: the step component's ``static_graph_rule``."""
    return static_graph_rule(summaries, WARN_SHARE)


def no_sync(summaries: list[dict[str, Any]]) -> Finding | None:
    """An all-reduce per micro-batch: the step component's ``no_sync_rule``."""
    return no_sync_rule(summaries, WARN_SHARE)


def threads(summaries: Summaries, children: str | None = None) -> Finding | None:
    """More threads than CPUs over a host's ranks; ``children``: the script's command, when the ranks are
    its ``torch.multiprocessing`` children rather than a launcher's workers."""
    by_host: dict[str, list[RankSummary]] = defaultdict(list)
    for s in _typed(summaries):
        if s.process.get("intra_op_threads"):
            by_host[s.host or "?"].append(s)
    for host, ranks in by_host.items():
        if len(ranks) < 2:
            continue
        want = sum(s.process["intra_op_threads"] for s in ranks)
        cpus: set[int] = set()
        overlap = False
        for s in ranks:
            aff = set(s.process.get("affinity") or range(s.process.get("cpu_count") or 1))
            overlap = overlap or bool(cpus & aff)
            cpus |= aff
        if want <= len(cpus):
            continue
        each = max(1, len(cpus) // len(ranks))
        cpu = ", ".join(
            f"rank {s.rank} {s.process['intra_op_threads']} threads"
            + (
                f" ({s.process['busy_cpus']:.1f} CPUs busy on average)"
                if s.process.get("busy_cpus")
                else ""
            )
            for s in ranks
        )
        fix = (
            f"Give each rank its share of the cores: OMP_NUM_THREADS={each} (cores / local ranks), "
            "or torch.set_num_threads in the script; `pitstop launch` also pins each rank to its own cores."
        )
        if children is not None:
            fix = (
                f"Give each child process its share of the cores: OMP_NUM_THREADS={each} (cores / children) "
                f"for the script, or torch.set_num_threads({each}) at the start of each child's function."
            )
        launch = children or f"torchrun --nproc_per_node={len(ranks)} train.py"
        return Finding(
            id="distributed.threads",
            severity=Severity.WARN,
            title=f"{len(ranks)} ranks x their threads = {want} threads on {len(cpus)} CPUs",
            evidence=f"on {host}: {cpu}; affinity {'overlaps' if overlap else 'is separate'} across ranks "
            f"({len(cpus)} CPUs in all): the ranks' threads take turns on the same cores",
            data={"host": host, "threads": want, "cpus": len(cpus), "overlap": overlap, "per_rank": each},
            fix=fix,
            fix_code=f"OMP_NUM_THREADS={each} {launch}",
        )
    return None


def backend(summaries: Summaries) -> list[Finding]:
    out: list[Finding] = []
    ranks = _typed(summaries)
    s = next((s for s in ranks if s.backend), None)
    if s is not None and s.backend == "gloo" and "cuda" in s.devices:
        out.append(
            Finding(
                id="distributed.backend",
                severity=Severity.WARN,
                title="gloo carries CUDA tensors: they go through host memory",
                evidence=f"rank {s.rank}: process group backend gloo, collectives on {', '.join(s.devices)} tensors",
                fix="Use the NCCL backend for CUDA tensors.",
                fix_code='dist.init_process_group("nccl")',
            )
        )
    env = next((s.env for s in ranks if s.env), {})
    slow = {k: v for k, v in env.items() if (k == "NCCL_DEBUG" and v.upper() in ("INFO", "TRACE"))
            or (k in ("NCCL_BLOCKING_WAIT", "TORCH_NCCL_BLOCKING_WAIT", "CUDA_LAUNCH_BLOCKING") and v == "1")
            or (k == "TORCH_DISTRIBUTED_DEBUG" and v.upper() == "DETAIL")}  # fmt: skip
    if slow:
        out.append(
            Finding(
                id="distributed.backend",
                severity=Severity.INFO,
                title="Debug or blocking settings for communication are on",
                evidence="set in the ranks' environment: " + ", ".join(f"{k}={v}" for k, v in slow.items()),
                data={"env": slow},
                fix="Unset them for training runs: each one adds logging or host synchronisation to collectives.",
                fix_code="unset " + " ".join(slow),
            )
        )
    return out


def comm_untimed(summaries: Summaries) -> Finding | None:
    """A DDP model whose gradient reduction pitstop could not time (a built-in C++ comm hook)."""
    for s in _typed(summaries):
        ddp = next((d for d in s.ddp if d.get("hook_untimed") or d.get("hook_error")), None)
        if ddp is None:
            continue
        why = ddp.get("hook_untimed") or f"the timing hook could not be registered ({ddp['hook_error']})"
        return Finding(
            id="distributed.comm_untimed",
            severity=Severity.INFO,
            title="DDP's gradient communication is not timed on this model",
            evidence=f"rank {s.rank}: comm hook {ddp.get('hook')} (DDP at {ddp.get('location')}): {why}; "
            "the all-reduce time and its exposed part are missing from the steps' communication",
            data={"rank": s.rank, "hook": ddp.get("hook"), "why": why},
            location=ddp.get("location"),
            fix="To have it timed, register the Python form of the hook for the profile run "
            "(default_hooks.allreduce_hook, default_hooks.fp16_compress_hook): pitstop times those.",
            fix_code="from torch.distributed.algorithms.ddp_comm_hooks import default_hooks\n"
            "model.register_comm_hook(None, default_hooks.fp16_compress_hook)",
        )
    return None


def probes_on_ranks(probes: dict[int, dict[str, Any] | None]) -> Finding | None:
    """Say where the exit probes ran: rank 0 only, on a copy of its model outside DDP, after every rank
    stopped; the other ranks skip them (their model and batch are rank 0's in kind)."""
    if len(probes) < 2:
        return None
    p0 = probes.get(0)
    rest = [str(r) for r in sorted(probes) if r != 0]
    others = ("rank " if len(rest) == 1 else "ranks ") + ", ".join(rest)
    if p0 is None:
        ran = "rank 0 did not probe either (the run did not end cleanly after its measured steps)"
    else:
        skipped = [s for s in p0.get("skipped") or [] if s.startswith("model:")]
        ran = "rank 0 probed " + (
            f"its optimizers only ({skipped[0][len('model: ') :]})"
            if skipped
            else "a copy of its model outside DDP"
        )
    return Finding(
        id="profile.probes_ranks",
        severity=Severity.INFO,
        title="Exit probes ran on rank 0 only",
        evidence=f"{ran}, after every rank had stopped; probes skipped on {others}: a probe runs forward "
        "and backward alone, and must never start a collective its peers would not join",
        data={
            "probed": [0] if p0 is not None else [],
            "skipped_ranks": [r for r in sorted(probes) if r != 0],
        },
    )


def requested_processes(command: list[str]) -> int | None:
    """``--num_processes N`` (or ``=N``) of an ``accelerate launch`` command."""
    for i, a in enumerate(command):
        v = a.split("=", 1)[1] if a.startswith("--num_processes=") else None
        if a == "--num_processes" and i + 1 < len(command):
            v = command[i + 1]
        if v is not None:
            return int(v) if v.isdigit() else None
    return None


def fewer_processes(launcher: str, command: list[str], ranks: int) -> Finding | None:
    """``accelerate launch --cpu --num_processes N`` runs one process (multi-CPU needs mpirun)."""
    want = requested_processes(command) if launcher == "accelerate" else None
    if not want or ranks >= want:
        return None
    return Finding(
        id="distributed.processes",
        severity=Severity.WARN,
        title=f"accelerate launch started {ranks} process{'es' if ranks != 1 else ''}, not the {want} asked for",
        evidence=f"--num_processes {want} in `{' '.join(command)}`, {ranks} rank(s) ran"
        + (
            "; with --cpu, accelerate starts several processes only under mpirun (--mpirun_hostfile)"
            if "--cpu" in command
            else ""
        ),
        data={"requested": want, "ranks": ranks},
        fix="For several CPU processes without MPI, launch through torchrun (accelerate's --multi_gpu path, "
        "with Accelerator(cpu=True) in the script), or run torchrun --nproc_per_node directly.",
        fix_code=f"accelerate launch --multi_gpu --num_processes {want} train.py  # Accelerator(cpu=True)",
    )


def failure(summaries: Summaries, result: Any) -> Finding | None:
    if result.status in ("completed", "stopped") or not result.ranks:
        return None
    return Finding(
        id="distributed.failure",
        severity=Severity.ERROR,
        title=f"The {'run' if result.launcher == LAUNCHER else 'launch'} did not finish: {result.status}",
        evidence=result.error or "",
        data={"status": result.status, "ranks": {s.rank: s.status for s in _typed(summaries)}},
    )


def distributed_findings(summaries: Summaries, skew: dict[str, Any], result: Any) -> list[Finding]:
    children = " ".join(result.command) if result.launcher == LAUNCHER else None
    ranks = _typed(summaries)
    as_json = [s.to_json() for s in ranks]  # find_unused and no_sync read the summaries by key
    found = [f for f in (failure(ranks, result), straggler(ranks), comm_exposed(ranks)) if f]
    found += [
        f
        for f in (
            find_unused(as_json),
            no_sync(as_json),
            threads(ranks, children),
            comm_untimed(ranks),
        )
        if f
    ]
    found += backend(ranks)
    strag = next((f for f in found if f.id == "distributed.straggler"), None)
    if strag is not None and skew:
        op, row = max(skew.items(), key=lambda kv: kv[1]["median_skew_s"])
        strag.evidence += f"; ranks reach {op} {ms(row['median_skew_s'])} apart (median), rank {strag.data['rank']} last in {row['last_rank'].get(str(strag.data['rank']), 0)} of {row['calls']}"
        strag.data["skew"] = row
    return found
