"""Every rank's measurements -> one report with a section per rank.

Reads ``rank-R/measurements.json`` and ``rank-R/state.json`` from a run's folder (one node's, or a
folder that every node of a multi-node launch writes to, ``pitstop profile merge DIR``). Per-process
findings are kept per rank (their title and ``data["rank"]`` name it); the distributed findings
(``pitstop.profile.analyze.dist_rules``) compare the ranks.
"""

from __future__ import annotations

import contextlib
import json
import signal
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pitstop.findings import Finding, Report
from pitstop.host import cpu
from pitstop.profile.analyze import summary
from pitstop.profile.analyze.rulekit import ms
from pitstop.profile.rank import rank_worker as rw
from pitstop.profile.rank.rank_states import collective_name, read_states
from pitstop.profile.record.rank_summary import CommPerStep, RankBreakdown, RankSummary
from pitstop.profile.record.timeline import breakdown
from pitstop.profile.runs.result import MEASUREMENTS, RunResult, RunSpec, read_measurements

MERGE_WAIT_S = 10.0  # after the launcher ends: how long to wait for other nodes' ranks to write


@dataclass
class RanksResult(RunResult):
    """A launch's result: ``ranks`` holds each rank's own RunResult; ``steps``/``data`` are rank 0's."""

    ranks: dict[int, RunResult] = field(default_factory=dict)
    states: dict[int, dict[str, Any]] = field(default_factory=dict)
    launcher: str = "torchrun"
    hang: str | None = None

    def report(self) -> Report:
        return build_ranks_report(self)


def rank_dirs(out: Path) -> dict[int, Path]:
    found = {}
    for d in Path(out).glob("rank-*"):
        suffix = d.name.split("-", 1)[1]
        if d.is_dir() and suffix.isdigit():
            found[int(suffix)] = d
    return dict(sorted(found.items()))


def _final(d: Path) -> bool:
    try:
        return json.loads((d / rw.STATE).read_text()).get("status") not in (None, "running")
    except (OSError, ValueError):
        return False


def _wait_for_nodes(out: Path, wait_s: float) -> None:
    """Ranks of other nodes write to a shared folder on their own schedule: wait a little for them."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        dirs = rank_dirs(out)
        world = _world_size(dirs)
        if len(dirs) >= world and all(_final(d) for d in dirs.values()):
            return
        time.sleep(0.2)


def _world_size(dirs: dict[int, Path]) -> int:
    for d in dirs.values():
        try:
            return int(json.loads((d / MEASUREMENTS).read_text())["distributed"]["world_size"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return len(dirs)


def collect_ranks(
    spec: RunSpec,
    out: Path,
    returncode: int,
    status: str | None,
    hang: str | None,
    launcher: str,
    wall: float,
    wait_s: float | None = None,
    include: Callable[[RunResult], bool] | None = None,
) -> RanksResult:
    """Read every rank's record into a RanksResult (status and error say how the launch ended);
    ``include``: which ranks' records count (all by default)."""
    if status is None:
        _wait_for_nodes(out, MERGE_WAIT_S if wait_s is None else wait_s)
    ranks: dict[int, RunResult] = {}
    dirs = rank_dirs(out)
    for r, d in dirs.items():
        res = read_measurements(spec, d / MEASUREMENTS, returncode, None, wall)
        if include is None or include(res):
            ranks[r] = res
    states = {r: st for r, st in read_states(out).items() if include is None or r in ranks}
    for r, res in ranks.items():
        _explain_killed(r, res, states.get(r) or {}, dirs[r])
    first = ranks.get(0) or next(iter(ranks.values()), None)
    final, error = _launch_outcome(spec, ranks, states, first, returncode, status, hang, launcher)
    base = first or RunResult(returncode, error, [], [], {}, None, wall)
    local = ((base.data.get("distributed") or {}).get("local_world_size")) or len(ranks)
    base.config["local_world_size"] = local  # fix splits the cores between a node's ranks
    base.config["distributed"] = ddp_facts(ranks)  # what fix's DDP candidates need to know
    return RanksResult(
        returncode=returncode,
        error=error,
        steps=base.steps,
        losses=base.losses,
        config=base.config,
        callback_result=None,
        wall_s=wall,
        status=final,
        warmup_steps=base.warmup_steps,
        data=base.data,
        out_dir=out,
        command=list(spec.command),
        spec=spec,
        ranks=ranks,
        states=states,
        launcher=launcher,
        hang=hang,
    )


def _explain_killed(r: int, res: RunResult, st: dict[str, Any], rank_dir: Path) -> None:
    """A rank with no final record gets its own error (the launcher's exit status is not this rank's):
    its record stayed on another node, or it ended abruptly; other ranks are left as they are."""
    if res.status != "killed" or res.data.get("remote_missing"):  # (that record says why itself)
        return
    if st.get("remote") and not (rank_dir / MEASUREMENTS).exists():
        # only its state was copied here (pitstop.profile.rank.rank_share)
        res.error = (
            f"no record of rank {r} (on {st.get('host') or 'another node'}) reached this node: this node's "
            f"local rank 0, which copies them here, ended first; last seen at step {st.get('step', 0)}, "
            "and its own node's report has what it measured"
        )
        return
    last = st.get("collective_step")
    how = "ended abruptly (os._exit, a signal or a crash in native code)"
    with contextlib.suppress(OSError, ValueError):  # a followed child: its exit code, from its parent
        how = _exit_text(int((rank_dir / rw.EXIT_CODE).read_text()))
    res.error = (
        how
        + (f" after reaching its collectives of step {last}" if last is not None else "")
        + "; measurements up to its last periodic record"
    )


def _exit_text(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
    return f"ended with exit status {code} before writing its record (os._exit or a crash in native code)"


def _launch_outcome(
    spec: RunSpec,
    ranks: dict[int, RunResult],
    states: dict[int, dict[str, Any]],
    first: RunResult | None,
    returncode: int,
    status: str | None,
    hang: str | None,
    launcher: str,
) -> tuple[str, str | None]:
    """The launch's status and error: no rank measured, stopped (Ctrl-C, hang, timeout), a rank
    failed, or the first rank's own status."""
    failed = {r: res for r, res in ranks.items() if not res.ok}
    if not ranks:
        return status or "killed", f"{launcher} ended (exit status {returncode}) before any rank was measured"
    if status == "interrupted":
        return status, "interrupted (Ctrl-C): every rank stopped"
    if status in ("hung", "timeout"):
        error = (f"stopped: {hang}" if status == "hung" else f"timed out after {spec.timeout:g} s") + (
            f"; ranks at the stop: {hang}" if status == "timeout" and hang else ""
        )
        return status, error
    if failed:
        return _failure_outcome(ranks, failed, states)
    return (first.status if first else "completed"), None


def _failure_outcome(
    ranks: dict[int, RunResult], failed: dict[int, RunResult], states: dict[int, dict[str, Any]]
) -> tuple[str, str]:
    """The first rank to fail sets the status; the error quotes every failed rank, that one first,
    then where the other ranks were waiting meanwhile."""
    worst = _first_failure(failed, states)
    order = [worst] + [r for r in sorted(failed) if r != worst]
    error = "; ".join(f"rank {r}: {quote(failed[r].error)}" for r in order if failed[r].error)
    # a rank's final record holds where it was when it failed; its state file may be a later tick
    last = {r: ((res.data.get("distributed") or {}).get("state") or {}) for r, res in ranks.items()}
    waits = [
        desc
        for r in sorted(set(states) | set(last))
        if r != worst and (desc := _where(r, last.get(r) or {}) or _where(r, states.get(r) or {}))
    ]
    if waits:
        error += "; meanwhile " + "; ".join(waits)
    return ranks[worst].status, error


def ddp_facts(ranks: dict[int, RunResult]) -> dict[str, Any]:
    """Over every rank's measured steps: DDP forwards and gradient all-reduces per optimizer step (the
    medians), whether every DDP model on every rank kept the same parameters used (static graph), and
    rank 0's DDP settings."""
    forwards: list[float] = []
    rounds: list[float] = []
    static: list[bool] = []
    models: list[dict[str, Any]] = []
    for _, res in sorted(ranks.items()):
        comm = (res.data.get("distributed") or {}).get("comm") or {}
        measured = {s.index for s in res.steps}
        for k, row in (comm.get("per_step") or {}).items():
            if int(k) in measured:
                forwards.append(float(row.get("ddp_forwards", 0)))
                rounds.append(float(row.get("ddp_rounds", 0)))
        ddp = comm.get("ddp") or []
        static += [bool(d.get("graph_static")) for d in ddp]
        if not models:
            models = ddp
    return {
        "ddp": models,
        "forwards_per_step": median(forwards),
        "rounds_per_step": median(rounds),
        "graph_static": bool(static) and all(static),
    }


PEER_ERRORS = ("closed by peer", "connection reset", "broken pipe", "distbackenderror", "nccl", "timed out",
               "remote worker")  # fmt: skip
MAX_QUOTE = 300


def _first_failure(failed: dict[int, RunResult], states: dict[int, dict[str, Any]]) -> int:
    """The rank that failed on its own: one that raised or exited, before ranks that were stopped or lost
    a peer; among those, the one that ended first."""
    order = {"error": 0, "exited": 1, "killed": 2, "interrupted": 3, "timeout": 4}

    def key(r: int) -> tuple[bool, int, float]:
        err = (failed[r].error or "").lower()
        st = states.get(r) or {}
        # a rank of another node with no record here: when it ended is not known on this node
        known = not (st.get("remote") and failed[r].status == "killed")
        ended = (st.get("time_s") if known else None) or float("inf")
        return (any(m in err for m in PEER_ERRORS), order.get(failed[r].status, 5), ended)

    return min(failed, key=key)


def quote(error: str | None) -> str:
    """A rank's error in one line: its first line, shortened, with the user's file:line kept."""
    if not error:
        return ""
    first = error.strip().splitlines()[0]
    at = error[error.rfind(" (at ") :] if " (at " in error else ""
    text = first if len(first) <= MAX_QUOTE else first[:MAX_QUOTE] + "..."
    return text if not at or at.strip() in text else f"{text}{at.strip() and ' ' + at.strip()}"


def _where(rank: int, st: dict[str, Any]) -> str | None:
    cur = st.get("current")
    if not cur:
        return None
    at = f" at {cur['location']}" if cur.get("location") else ""
    return f"rank {rank} was waiting in {collective_name(cur)}{at} (step {st.get('step', 0)})"


def merge_dir(out: Path, wait_s: float = 0.0) -> RanksResult:
    """``pitstop profile merge DIR``: the report of the ranks a (multi-node) launch left in DIR."""
    spec = RunSpec(command=["(merged)"])
    result = collect_ranks(spec, Path(out), 0, None, None, "torchrun", 0.0, wait_s=wait_s)
    walls = [res.data.get("wall_s") or 0.0 for res in result.ranks.values()]
    result.wall_s = max(walls, default=0.0)
    return result


# ------------------------------------------------------------------------------------------ report


def rank_summary(rank: int, res: RunResult, state: Any = None) -> RankSummary:
    """One rank's section: its breakdown, steps, communication per step and process facts; ``state``: its
    watchdog's last word, for a rank that never wrote its own."""
    dist = res.data.get("distributed") or {}
    comm = dist.get("comm") or {}
    bd = breakdown(res.steps)
    per_step = comm.get("per_step") or {}
    measured = {s.index for s in res.steps}
    rows = [v for k, v in per_step.items() if int(k) in measured]
    n = max(1, len(res.steps))
    mean = {
        k: sum(r.get(k, 0.0) for r in rows) / n
        for k in ("collective_s", "ddp_comm_s", "ddp_exposed_s", "ddp_rounds", "unused_search_s", "ddp_bytes")
    }
    # DDP rounds timed on a sample of iterations (pitstop.profile.rank.ddp_timers): their mean times the rounds
    timed = sum(r.get("ddp_timed_rounds", r.get("ddp_rounds", 0)) for r in rows)
    mean["ddp_timed_rounds"] = timed / n
    for k in ("ddp_comm_s", "ddp_exposed_s", "ddp_bytes"):
        mean[k] = mean[k] * max(1.0, mean["ddp_rounds"] / mean["ddp_timed_rounds"]) if timed else 0.0
    return RankSummary.build(
        rank=rank,
        status=res.status,
        error=res.error,
        host=dist.get("hostname"),
        local_rank=dist.get("local_rank"),
        node_rank=dist.get("node_rank"),
        world_size=dist.get("world_size"),
        measured_steps=len(res.steps),
        breakdown=None
        if bd is None
        else RankBreakdown.from_json({"mean_step_s": bd.total_s, "median_step_s": bd.median_total_s, **bd.parts}),
        comm_per_step=CommPerStep.from_json(mean),
        steps=[s.to_dict() for s in res.warmup_steps + res.steps],
        comm_steps=per_step,
        collective_sites=comm.get("sites") or [],
        ddp=comm.get("ddp") or [],
        backend=comm.get("backend"),
        devices=comm.get("devices") or [],
        env=comm.get("env") or {},
        process=dist.get("process") or {},
        signal=dist.get("signal"),
        state=dist.get("state") or state,
    )


def build_ranks_report(result: RanksResult, extra: list[Finding] | None = None) -> Report:
    """The launch's report; ``extra``: findings about the run beside the ranks', weighed in its verdict."""
    from pitstop.profile.analyze.dist_rules import (
        distributed_findings,
        fewer_processes,
        probes_on_ranks,
        skew_summary,
    )
    from pitstop.profile.analyze.rules import problem_findings

    # a rank that never wrote its final record: its watchdog's last word
    summaries = [rank_summary(r, res, result.states.get(r)) for r, res in sorted(result.ranks.items())]
    calls = {
        r: ((res.data.get("distributed") or {}).get("comm") or {}).get("calls") or []
        for r, res in result.ranks.items()
    }
    warmup = result.spec.warmup if result.spec else 0
    skew = skew_summary(calls, warmup)
    findings: list[Finding] = distributed_findings(summaries, skew, result)
    if note := probes_on_ranks({r: res.data.get("probes") for r, res in result.ranks.items()}):
        findings.append(note)
    if few := fewer_processes(result.launcher, result.command, len(result.ranks)):
        findings.append(few)
    findings += extra or []
    cores = cpu.usable_cores()
    for r, res in sorted(result.ranks.items()):
        if not res.steps:
            continue
        for f in problem_findings(res.steps, res.measurements(), cores)[0]:  # one verdict for the launch, below
            f.title = f"rank {r}: {f.title}"
            f.data = {**f.data, "rank": r}
            findings.append(f)
    basis = None
    if result.ranks:
        measured = f"{len(result.ranks)} ranks, " + ", ".join(
            f"rank {s.rank} {ms(s.breakdown.median_step_s)}" for s in summaries if s.breakdown is not None
        )
        title = "No measured problem costs 5% of the step or more, on any rank"
        basis = summary.basis(title, measured, result.data.get("other_cpu_share"))
        last = summary.verdict(findings, **basis)
        findings += [last] if last else []
    sections: dict[str, Any] = {
        "ranks": [s.to_json() for s in summaries],
        "distributed": {"skew": skew, "hang": result.hang},
    }
    if result.steps:
        rank0 = next((s for s in summaries if s.breakdown is not None), None)
        if rank0 is not None and rank0.breakdown is not None:
            sections["breakdown"] = {"steps": rank0.measured_steps, **rank0.breakdown.to_json()}
            sections["steps"] = rank0.steps
    meta: dict[str, Any] = {
        "command": " ".join(result.command),
        "launcher": result.launcher,
        "status": result.status,
        "returncode": result.returncode,
        "ranks": len(result.ranks),
        "world_size": max([s.world_size or 0 for s in summaries], default=0) or len(result.ranks),
        "measured_steps": len(result.steps),
        "warmup_steps": len(result.warmup_steps),
        "steps_per_s": round(result.steps_per_s(), 4),
        "wall_s": round(result.wall_s, 2),
        "usable_cores": cores,
    }
    if basis is not None:
        meta[summary.BASIS] = basis
    error = result.error
    for r, res in sorted(result.ranks.items()):
        tb = res.data.get("traceback")
        if tb and res.status == "error":
            error = f"{error}\n\nrank {r} traceback:\n{tb}"
            break
    return Report(tool="profile", findings=findings, sections=sections, meta=meta, error=error)


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else 0.0
