"""The report of a run whose training ran in child processes (``pitstop.profile.process.children``).

The children's records (``rank-N/`` in the run's folder) are read and merged by the ranks' machinery
(``pitstop.profile.runs.merge``): a section and a breakdown per child, per-child findings, the distributed rules
(stragglers where the children wait for each other in collectives, threads against cores), one verdict.
The script's own process is the parent: its record says how the script ended, and its forwards outside
any training step (a test pass on the trained model) are named as such rather than as a missing step.
A child that was blocked when pitstop stopped the run (its watchdog's dump, ``pitstop.profile.capture.watchdog``)
is named in the run's error (which child, its pid, the line and the call it waits in) and gets its
``profile.hang`` finding with its stacks, as a hung rank does.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, fields
from pathlib import Path

from pitstop.findings import Finding, Report, Severity
from pitstop.profile.capture.watchdog import WATCHDOG_FILE
from pitstop.profile.capture.watchdog import request_stacks as request_dump
from pitstop.profile.process.children import LAUNCHER
from pitstop.profile.rank.rank_states import alive, read_states
from pitstop.profile.runs.merge import RanksResult, build_ranks_report, collect_ranks, quote
from pitstop.profile.runs.result import RunResult, RunSpec


@dataclass
class ChildrenResult(RanksResult):
    """``ranks``: the children that trained (or failed), by the order they were started in; ``parent``:
    the script's own process."""

    parent: RunResult | None = None

    def report(self) -> Report:
        return build_children_report(self)


def steps_so_far(out: Path) -> int | None:
    """The steps (warm-up included) the slowest measured child has done; None while no child is."""
    states = read_states(out)
    return min((int(s.get("step", 0)) for s in states.values()), default=None)


def request_stacks(out: Path, reason: str, wait_s: float) -> None:
    """Before the run is stopped: each live child's watchdog dumps its stacks (``rank-N/watchdog.json``),
    as the script's own process does. No child (no ``rank-N`` folder): nothing is read or written."""
    for d in sorted(out.glob("rank-*")):
        if not (d / WATCHDOG_FILE).exists():
            continue
        with contextlib.suppress(OSError, ValueError):
            pid = int(json.loads((d / WATCHDOG_FILE).read_text()).get("pid") or 0)
            if alive(pid):
                request_dump(d, reason, wait_s=wait_s, alive=lambda pid=pid: alive(pid))


def hung_children(ranks: dict[int, RunResult]) -> str | None:
    """'child 1 (pid 123, Process-2) hung at train.py:40 in time.sleep: no progress for 12.0 s (3 steps
    done)' for each child stopped blocked, or None."""
    parts = []
    for r, res in sorted(ranks.items()):
        dump = res.hang
        if not dump:
            continue
        dist = res.data.get("distributed") or {}
        pid = dist.get("pid") or (res.data.get("watchdog") or {}).get("pid")
        name = (dist.get("child") or {}).get("name")
        main = dump.get("main") or {}
        call = f" in {main['call']}" if main.get("call") else ""
        who = ", ".join(str(x) for x in (f"pid {pid}" if pid else None, name) if x)
        parts.append(
            f"child {r}{f' ({who})' if who else ''} hung at {main.get('where') or 'an unknown place'}{call}: "
            f"no progress for {dump['since_progress_s']:.1f} s ({dump.get('steps_done', 0)} steps done)"
        )
    return "; ".join(parts) or None


def collect(spec: RunSpec, parent: RunResult, out: Path) -> RunResult:
    """``parent`` (the script's own record) with what its children measured: a ``ChildrenResult`` when a
    child trained or failed, else ``parent`` as it is."""
    if not any(out.glob("rank-*")):
        return parent
    override = parent.status if parent.status in ("interrupted", "timeout") else None
    ranks = collect_ranks(spec, out, parent.returncode, override, None, LAUNCHER, parent.wall_s, wait_s=0.0,
                          include=lambda r: bool(r.steps or r.warmup_steps) or not r.ok)  # fmt: skip
    if not ranks.ranks:
        return parent
    result = ChildrenResult(**{f.name: getattr(ranks, f.name) for f in fields(ranks)}, parent=parent)
    if result.ok and not parent.ok:  # the children trained; the script failed around them
        result.status, result.returncode = parent.status, parent.returncode
        result.error = f"the parent process: {quote(parent.error)}"
    result.data["other_cpu_share"] = parent.data.get("other_cpu_share")
    hung = hung_children(result.ranks)
    if hung is not None:
        result.hang = hung
        result.error = f"{result.error}; {hung}" if result.error else hung
    return result


def build_children_report(result: ChildrenResult) -> Report:
    parent = result.parent
    extra = [children_note(result), *_unmeasured_hangs(result)]
    if parent is not None and parent.steps:  # the parent trained too: its findings, named as its own
        from pitstop.profile.analyze.rules import problem_findings

        for f in problem_findings(parent.steps, parent.measurements())[0]:
            f.title = f"parent process: {f.title}"
            f.data = {**f.data, "process": "parent"}
            extra.append(f)
    report = build_ranks_report(result, extra)
    report.findings = [
        probes_note(result, f) if f.id == "profile.probes_ranks" else f for f in report.findings
    ]
    report.meta["children"] = len(result.ranks)
    report.meta["start_methods"] = _start_methods(result)
    if parent is not None:
        report.sections["parent"] = {
            "status": parent.status,
            "error": parent.error if not parent.ok else None,
            "measured_steps": len(parent.steps),
            "totals": parent.data.get("totals") or {},
        }
        if parent.status == "error" and parent.data.get("traceback") and result.status == parent.status:
            report.error = f"{report.error}\n\nparent process traceback:\n{parent.data['traceback']}"
    return report


def _unmeasured_hangs(result: RanksResult) -> list[Finding]:
    """The hang of a child that had measured no step yet (the ranks' report gives findings to the
    children with steps only)."""
    from pitstop.profile.analyze.rules_progress import hang_finding

    found = []
    for r, res in sorted(result.ranks.items()):
        wd = res.data.get("watchdog") or {}
        if res.steps or not wd.get("hang"):
            continue
        f = hang_finding(wd, res.data, wd.get("run_status"))
        if f is not None:
            f.title = f"rank {r}: {f.title}"
            f.data = {**f.data, "rank": r}
            found.append(f)
    return found


def _start_methods(result: RanksResult) -> list[str]:
    found = {
        ((r.data.get("distributed") or {}).get("child") or {}).get("start_method")
        for r in result.ranks.values()
    }
    return sorted(m for m in found if m)


def children_note(result: ChildrenResult) -> Finding:
    """Where the training ran: N children, how they started, their steps; what the parent did."""
    n = len(result.ranks)
    facts = {r: (res.data.get("distributed") or {}).get("child") or {} for r, res in result.ranks.items()}
    methods = _start_methods(result)
    shared = any(f.get("shared_parameters") for f in facts.values())
    grouped = any(f.get("process_group") for f in facts.values())
    kind = ", one process group (each child a rank)" if grouped else ""
    kind += ", parameters shared between them (Hogwild)" if shared else ""
    per = "; ".join(
        f"rank {r} ({facts[r].get('name') or 'child'}): {len(res.steps)} measured steps"
        + (f", {1000 * res.median_step_s():.1f} ms median" if res.steps else "")
        + ("" if res.ok else f", {res.status}")
        for r, res in sorted(result.ranks.items())
    )
    parent = result.parent
    totals = (parent.data.get("totals") if parent is not None else None) or {}
    did = (
        f"; the parent process measured {len(parent.steps)} steps of its own"
        if parent is not None and parent.steps
        else f"; the parent process ran {totals.get('forwards', 0)} forward pass(es) "
        f"({totals.get('forward_s', 0.0):.3f} s) and no training step (evaluation or setup, not measured as steps)"
    )
    return Finding(
        id="profile.children",
        severity=Severity.INFO,
        title=f"Training ran in {n} child process{'es' if n != 1 else ''} "
        f"({LAUNCHER}, {'/'.join(methods) or 'unknown'} start)",
        evidence=f"{per}{kind}{did}. Each child is measured on its own, as torchrun's ranks are; the "
        "report's steps are rank 0's.",
        data={
            "children": n,
            "start_methods": methods,
            "shared_parameters": shared,
            "process_group": grouped,
            "parent": {"measured_steps": len(parent.steps) if parent else 0, **totals},
        },
    )


def probes_note(result: ChildrenResult, note: Finding) -> Finding:
    """The ranks' note on where the exit probes ran, said of children: child 0 probed once the others had
    ended, on a copy of the model where its parameters are shared."""
    first = result.ranks.get(0)
    if first is None or first.data.get("probes") is None:
        return note
    child = (first.data.get("distributed") or {}).get("child") or {}
    what = "a copy of its model (its parameters are shared with the other processes)"
    rest = ", ".join(str(r) for r in sorted(result.ranks) if r != 0)
    note.evidence = (
        f"rank 0 probed {what if child.get('shared_parameters') else 'its model'}, after the other children had "
        f"ended; probes skipped on rank{'s' if ',' in rest else ''} {rest}: a probe runs alone, so that no "
        "other process loads the cores it times"
    )
    return note
