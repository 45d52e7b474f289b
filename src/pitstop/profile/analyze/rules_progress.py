"""Findings about progress: a run stopped while hung (``profile.hang``), cut short while still working
(``profile.timeout``), steps that stalled and recovered (``profile.stall``, from ``pitstop.profile.analyze.stalls``),
a DataLoader worker that died (``dataloader.worker_died``), a periodic record that could not be written
(``profile.record_write_failed``). Pure functions of the measurements record and the watchdog's record
(``Measurements.watchdog``, see ``pitstop.profile.capture.watchdog``); the stacks travel in each finding's data.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from pitstop.findings import Finding, Severity
from pitstop.profile.analyze.registry import RunView, rule
from pitstop.profile.analyze.stalls import stall_findings
from pitstop.profile.capture.stacks import KINDS, describe_exit
from pitstop.profile.capture.watchdog import REQUEST_WAIT_S
from pitstop.profile.record.measurements import Measurements
from pitstop.profile.record.parts import WatchdogRecord

_TB_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+), in (\S+)', re.M)

FIXES = {
    "sleep": "The script sleeps here: remove or shorten the sleep, or make it conditional.",
    "queue": "Nothing puts into this queue any more: check the thread or process that feeds it (a producer "
    "that died is listed above) and use `get(timeout=...)` so a dead producer raises instead of hanging.",
    "dataloader": "A DataLoader worker is stuck or gone: pass `DataLoader(..., timeout=120)` so a stuck "
    "worker raises, and look at what the dataset's __getitem__ does (locks, network, a file that blocks).",
    "collective": "Ranks are not running the same collectives: check that every rank makes the same number "
    "of steps and the same all_reduce/barrier calls (uneven data, an `if rank == 0` around a collective); "
    "set `timeout=` in init_process_group so a missing rank raises.",
    "lock": "Another thread holds this lock or never sets this event/condition: check the thread stacks "
    "above for who holds it, and acquire with a timeout.",
    "join": "The thread or process being joined does not finish: see its stack above.",
    "io": "Blocked on I/O: a socket, pipe or file that does not answer; add a timeout to the call.",
    "other": "See the stacks: the innermost user frame is where the script was when it was stopped.",
}


@rule(order=10, when="always")
def progress_rule(v: RunView) -> list[Finding]:
    return progress_rules(v.m)


def progress_rules(data: Measurements | Mapping[str, Any]) -> list[Finding]:
    """All progress findings for one run's measurements record (hang, timeout, stalls, dead workers)."""
    m = Measurements.of(data)
    wd = m.watchdog or WatchdogRecord()
    out: list[Finding] = []
    status = wd.run_status or m.status
    hang = hang_finding(wd, m, status)
    if hang is not None:
        out.append(hang)
    elif status == "timeout" and wd.stop:
        out.append(_timeout_finding(wd.stop))
    out += stall_findings(m.steps or [], wd)
    if hang is None or hang.data.get("kind") != "dataloader":
        out += worker_died_findings(wd, m, status)
    if m.flush_error:
        out.append(record_write_failed_finding(m.flush_error))
    return out


def record_write_failed_finding(error: str) -> Finding:
    """``profile.record_write_failed``: a periodic flush of the measurements record failed while the script
    ran. The script went on and the report comes from the final record; what was at risk is what a SIGKILL
    (the OOM killer, a scheduler's hard stop) would have lost."""
    return Finding(
        id="profile.record_write_failed",
        severity=Severity.INFO,
        title="pitstop could not write its running record during the run; the report is from the final one",
        evidence=f"the last failed write: {error}",
        data={"error": error},
        fix="Nothing in the script changed. Check free space and permissions where the run's files go "
        "(`--out-dir`, else the temp folder): while these writes fail, a run killed with SIGKILL (the OOM "
        "killer, a scheduler's hard stop) loses the steps measured since the last good write.",
    )


# ------------------------------------------------------------------------------------------- hang


def _last_step_text(dump: dict[str, Any]) -> str:
    last = dump.get("last_step")
    if not last:
        return (
            f"no step had completed ({dump.get('batches', 0)} batches loaded, "
            f"{dump.get('forwards', 0)} forward calls)"
        )
    return f"{last['index'] + 1} steps completed, the last one's optimizer.step() {last['ended_s_ago']:.1f} s before"


def _dead_text(dump: dict[str, Any]) -> str:
    parts = []
    for ld in dump.get("loaders") or []:
        for w in ld.get("workers") or []:
            if w.get("exitcode") not in (None, 0):
                parts.append(
                    f"DataLoader worker pid {w['pid']} {describe_exit(w['exitcode'])} "
                    f"({ld.get('pending_batches')} batches pending, loader built at {ld.get('location')})"
                )
    for t in dump.get("dead_threads") or []:
        parts.append(f"thread {t.get('name')!r} died with {t.get('error')} (at {t.get('where')})")
    return "; ".join(parts)


def hang_finding(
    watchdog: WatchdogRecord | Mapping[str, Any], data: Measurements | Mapping[str, Any], status: str | None
) -> Finding | None:
    wd = WatchdogRecord.of(watchdog)
    dump = wd.hang
    stopped = status in ("timeout", "interrupted", "killed")
    if dump is None and wd.unanswered and not wd.error and stopped:
        return _native_hang(wd, Measurements.of(data))
    if dump is None:
        return None
    main = dump.get("main") or {}
    where, call, kind = main.get("where"), main.get("call"), main.get("kind") or "other"
    dead = _dead_text(dump)
    if kind == "dataloader" and any(
        w.get("exitcode") not in (None, 0)
        for ld in dump.get("loaders") or []
        for w in ld.get("workers") or []
    ):
        meaning = "waiting in DataLoader.__next__ on a worker that is dead"
    else:
        meaning = KINDS.get(kind, KINDS["other"])
    taken = {"timeout": "at --timeout", "interrupted": "at Ctrl-C", "hang": "by the watchdog"}.get(
        dump.get("reason", ""), ""
    )
    code = f" `{main['code']}`" if main.get("code") else ""
    threads = dump.get("threads") or []
    evidence = (
        f"No progress for {dump['since_progress_s']:.1f} s (stacks taken {taken}); {_last_step_text(dump)}. "
        f"The main thread is blocked at {where}{code}"
        + (f" in {call}" if call else "")
        + f": {meaning}."
        + (f" {dead}." if dead else "")
        + f" {len(threads)} Python thread(s); their stacks are in this finding's data."
    )
    return Finding(
        id="profile.hang",
        severity=Severity.ERROR,
        title=f"Training hung at {where}" + (f" in {call}" if call else ""),
        evidence=evidence,
        data={
            "reason": dump.get("reason"),
            "since_progress_s": dump["since_progress_s"],
            "last_step": dump.get("last_step"),
            "median_step_s": dump.get("median_step_s"),
            "blocked_at": where,
            "code": main.get("code"),
            "call": call,
            "innermost": main.get("inner"),
            "kind": kind,
            "threads": threads,
            "loaders": dump.get("loaders") or [],
            "dead_threads": dump.get("dead_threads") or [],
        },
        fix=FIXES.get(kind, FIXES["other"]),
        location=where,
    )


def _native_hang(wd: WatchdogRecord, m: Measurements) -> Finding:
    samples = wd.samples or []
    last = (samples[-1].get("main") or {}) if samples else {}
    n = len(m.steps or [])
    return Finding(
        id="profile.hang",
        severity=Severity.ERROR,
        title="Training hung inside native code that holds the GIL",
        evidence=f"When the run was stopped, pitstop's watchdog thread could not run for "
        f"{REQUEST_WAIT_S:g} s: the main thread is inside a C/C++/CUDA call that never releases "
        f"the GIL. {n} steps had completed."
        + (f" The last sampled place was {last.get('where')} in {last.get('call')}." if last else ""),
        data={"kind": "native", "steps": n, "blocked_at": last.get("where"), "threads": []},
        fix="Run the script under `py-spy dump --native --pid PID` while it hangs to see the native frames; "
        "a deadlock in an extension or a CUDA call waiting on a hung kernel are the usual causes.",
        location=last.get("where"),
    )


def _timeout_finding(stop: dict[str, Any]) -> Finding:
    main = stop.get("main") or {}
    return Finding(
        id="profile.timeout",
        severity=Severity.WARN,
        title="Stopped by --timeout while training was still making progress",
        evidence=f"{_last_step_text(stop)}: the script was working, not hung; it was at {main.get('where')}"
        + (f" in {main.get('call')}" if main.get("call") else "")
        + ". The findings cover the steps measured before the stop.",
        data={
            "steps_done": stop.get("steps_done"),
            "last_step": stop.get("last_step"),
            "since_progress_s": stop.get("since_progress_s"),
            "blocked_at": main.get("where"),
            "threads": stop.get("threads") or [],
        },
        fix="Raise --timeout, or drop --full to stop after the measured steps.",
        location=main.get("where"),
    )


# ---------------------------------------------------------------------------------- worker died


def worker_died_findings(
    watchdog: WatchdogRecord | Mapping[str, Any], data: Measurements | Mapping[str, Any], status: str | None
) -> list[Finding]:
    """A worker of the script's DataLoader exited non-zero (a crash, the OOM killer's SIGKILL)."""
    wd = WatchdogRecord.of(watchdog)
    dead: list[tuple[dict[str, Any], dict[str, Any]]] = []
    for seen in (wd.end, wd.error, wd.stop):  # the first record that saw the dead worker's exit code
        loaders = (seen.get("loaders") if isinstance(seen, dict) else None) or []
        dead = [
            (ld, w) for ld in loaders for w in ld.get("workers") or [] if w.get("exitcode") not in (None, 0)
        ]
        if dead:
            break
    if not dead or status in ("completed", "stopped"):
        return []
    ld, w = dead[0]
    how = describe_exit(w["exitcode"])
    m = Measurements.of(data)
    where, call = _error_site(m.traceback or "")
    why = (
        " SIGKILL usually comes from the kernel's out-of-memory killer (`dmesg` says so) or a job scheduler."
        if w["exitcode"] == -9
        else ""
    )
    got = ld.get("batches_received")
    per_epoch = ld.get("batches_per_epoch")
    err = (m.error or "").split("\n")[0]
    return [
        Finding(
            id="dataloader.worker_died",
            severity=Severity.ERROR,
            title=f"A DataLoader worker was {how}" if w["exitcode"] < 0 else f"A DataLoader worker {how}",
            evidence=f"worker pid {w['pid']} of the DataLoader built at {ld.get('location')} {how}"
            + (
                f" after about {got} of {per_epoch} batches of the epoch"
                if got is not None and per_epoch
                else ""
            )
            + f" ({ld.get('pending_batches')} batches pending); the main thread then failed"
            + (f" at {where}" if where else "")
            + (f" in {call}" if call else "")
            + (f": {err}" if err else "")
            + f".{why}",
            data={"loader": ld, "dead_workers": [w for _, w in dead], "failed_at": where},
            fix="Find why the worker died: its own traceback precedes this in the script's stderr for an "
            "exception; for SIGKILL lower the workers' memory (fewer workers, smaller prefetch_factor, "
            "no large objects copied into each worker).",
            location=where or ld.get("location"),
        )
    ]


def _error_site(tb: str) -> tuple[str | None, str | None]:
    """The innermost user frame of a formatted traceback, and the call made from it."""
    if not tb:
        return None, None
    from pitstop.profile.capture.where import is_user_file, location

    frames = _TB_FRAME.findall(tb)
    for i in range(len(frames) - 1, -1, -1):
        path, line, _name = frames[i]
        if is_user_file(path):
            inner = [f for f in frames[i + 1 :] if "/pitstop/" not in f[0]]
            return location(path, int(line)), (inner[0][2] if inner else None)
    return None, None
