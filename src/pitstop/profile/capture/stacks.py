"""Python stacks of a running process, read from another thread: what each thread is doing, where the
main thread is blocked in the user's code and in which call, and the state of DataLoader workers.

Used by ``pitstop.profile.capture.watchdog`` inside the profiled process; nothing here prints or measures time.
Frames are plain dicts (innermost first) so they travel as JSON to the parent's report.
"""

from __future__ import annotations

import linecache
import os
import re
import sys
import threading
from typing import Any

MAX_FRAMES = 60  # innermost frames kept per thread: the blocking call and the user's code around it
_CALL = re.compile(r"([A-Za-z_][\w.]*)\s*\(")

# kind -> what it means, in the finding's words
KINDS = {
    "sleep": "the script is sleeping",
    "queue": "waiting on a queue that nothing puts into",
    "dataloader": "waiting in DataLoader.__next__ for a batch",
    "collective": "waiting in a torch.distributed collective (another rank has not joined it)",
    "lock": "waiting for a lock, condition or event another thread should release or set",
    "join": "waiting for another thread or process to finish",
    "io": "waiting on I/O (a socket, pipe or file)",
    "other": "running or blocked in this call",
}


def frames_of(frame: Any) -> list[dict[str, Any]]:
    """A frame and its callers as dicts, innermost first (at most MAX_FRAMES)."""
    from pitstop.profile.capture.where import is_user_file

    out: list[dict[str, Any]] = []
    while frame is not None and len(out) < MAX_FRAMES:
        code = frame.f_code
        # another thread's frame read between instructions can have no line number (None): its
        # function's first line then, so the dump is still written
        line = frame.f_lineno or code.co_firstlineno
        out.append(
            {
                "file": code.co_filename,
                "line": line,
                "function": getattr(code, "co_qualname", code.co_name),
                "module": str(frame.f_globals.get("__name__", "")),
                "user": is_user_file(code.co_filename),
                "code": linecache.getline(code.co_filename, line).strip(),
            }
        )
        frame = frame.f_back
    return out


def all_threads(skip: set[int] | None = None) -> list[dict[str, Any]]:
    """Every thread's stack (``sys._current_frames``), the main thread first."""
    skip = skip or set()
    names = {t.ident: t for t in threading.enumerate()}
    main = threading.main_thread().ident
    out = []
    for ident, frame in sys._current_frames().items():
        if ident in skip:
            continue
        t = names.get(ident)
        frames = frames_of(frame)
        out.append(
            {
                "ident": ident,
                "name": t.name if t is not None else f"thread {ident}",
                "daemon": bool(t.daemon) if t is not None else None,
                "main": ident == main,
                "frames": frames,
                "blocked": describe(frames),
            }
        )
    out.sort(key=lambda t: not t["main"])
    return out


def main_thread_frames() -> list[dict[str, Any]]:
    frame = sys._current_frames().get(threading.main_thread().ident)
    return frames_of(frame) if frame is not None else []


def _is_pitstop(f: dict[str, Any]) -> bool:
    return f["module"].startswith("pitstop.")


def _name(f: dict[str, Any]) -> str:
    return f"{f['module']}.{f['function']}" if f["module"] else f["function"]


def describe(frames: list[dict[str, Any]]) -> dict[str, Any]:
    """Where a thread is: its innermost user frame (``where``, the source ``code`` on that line), the
    call it is in (``call``: the first frame it called outside pitstop, or the function named on the
    line when that is native code such as ``time.sleep``), the innermost frame (``inner``) and a
    ``kind`` of wait (a key of KINDS)."""
    if not frames:
        return {"where": None, "code": "", "call": None, "inner": None, "kind": "other"}
    u = next((i for i, f in enumerate(frames) if f["user"]), None)
    if u is None:  # no user code on this stack (a library thread): name its innermost non-pitstop frame
        u = next((i for i, f in enumerate(frames) if not _is_pitstop(f)), 0)
    top = frames[u]
    code = top.get("code", "")
    callees = [f for f in frames[:u] if not _is_pitstop(f)]
    if callees:  # the call made from the user's line, past decorators' wrappers (closures)
        named = [f for f in callees if "<locals>" not in f["function"]] or callees
        call = _name(named[-1])
    else:
        names = _CALL.findall(code)
        call = names[-1] if names else None
    inner = _name(frames[0])
    return {
        "where": _where(top["file"], top["line"]),
        "file": top["file"],
        "line": top["line"],
        "function": top["function"],
        "code": code,
        "call": call,
        "inner": inner,
        "kind": _kind(callees, code),
    }


def _kind(callees: list[dict[str, Any]], code: str) -> str:
    mods = " ".join(_name(f) for f in callees)
    native = not callees  # the user's line called native code directly (time.sleep, Work.wait, lock.acquire)
    if "torch.distributed" in mods or (native and re.search(r"\bdist\.|\b\w*work\w*\.wait\(", code, re.I)):
        return "collective"
    if "torch.utils.data" in mods:
        return "dataloader"
    if native and re.search(r"\bsleep\s*\(", code):
        return "sleep"
    if re.search(r"\bqueues?\.|Queue\.get", mods) or (native and re.search(r"\.get(_nowait)?\(", code)):
        return "queue"
    if re.search(r"\.join\b|_wait_for_tstate_lock|popen_fork", mods) or (native and ".join(" in code):
        return "join"
    if re.search(r"threading\.(Condition|Event|Semaphore|Barrier)", mods) or re.search(r"\.acquire\(", code):
        return "lock"
    if re.search(r"socket|selectors|ssl\.|connection\.|subprocess", mods):
        return "io"
    return "other"


def _where(filename: str, line: int) -> str:
    from pitstop.profile.capture.where import location

    return location(filename, line)


# ------------------------------------------------------------------------------------ DataLoaders


def exit_code(proc: Any, reap: bool) -> int | None:
    """A worker process's exit code (negative: killed by that signal), None while it runs. Without
    ``reap`` the child is only looked at (``waitid`` with ``WNOWAIT``), so torch's own worker-failure
    checks still see it die."""
    popen = getattr(proc, "_popen", None)
    if popen is None:
        return None
    if popen.returncode is not None:
        return int(popen.returncode)
    if reap:
        return proc.exitcode
    try:
        info = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except (ChildProcessError, OSError):
        return None
    if info is None or info.si_pid == 0:
        return None
    killed = info.si_code in (os.CLD_KILLED, os.CLD_DUMPED)
    return -info.si_status if killed else info.si_status


class WorkerPools:
    """The worker processes of the script's DataLoader iterators. The Process objects are kept (not the
    iterators), so a worker's exit code is still known after its iterator was dropped by the exception
    the worker's death caused. ``track`` is cheap: it looks only at iterators new since the last call and
    at the live ones it holds."""

    def __init__(self) -> None:
        self.pools: list[dict[str, Any]] = []
        self._seen = 0

    def track(self, pools: list[tuple[Any, list[Any], Any]]) -> None:
        """``pools``: (iterator weakref, worker processes, CapturedLoader) as the instrumentation
        recorded them when each iterator started its workers."""
        for ref, workers, cap in pools[self._seen :]:
            it = ref()
            try:
                per_epoch = len(it) if it is not None else None
            except TypeError:
                per_epoch = None
            loc = getattr(cap, "location", None)
            self.pools.append({"ref": ref, "workers": list(workers), "location": loc, "per_epoch": per_epoch})
        self._seen = len(pools)
        keep = []
        for pool in self.pools:
            it = pool["ref"]()
            if it is not None:
                pool["received"] = getattr(it, "_rcvd_idx", None)
                pool["pending"] = getattr(it, "_tasks_outstanding", None)
            codes = [getattr(getattr(w, "_popen", None), "returncode", None) for w in pool["workers"]]
            if it is None and all(c == 0 for c in codes):
                continue  # a pool that was shut down cleanly: nothing to report
            keep.append(pool)
        self.pools = keep

    def state(self, reap: bool = False) -> list[dict[str, Any]]:
        """Pools still running or that lost a worker: pid, alive, exit code of each worker; batches
        received from the workers and still pending (as of the last ``track``)."""
        out = []
        for pool in self.pools:
            states = []
            for w in pool["workers"]:
                code = exit_code(w, reap)
                states.append({"pid": w.pid, "alive": code is None, "exitcode": code})
            died = any(st["exitcode"] not in (None, 0) for st in states)
            it = pool["ref"]()
            if (it is None or getattr(it, "_shutdown", False)) and not died:
                continue  # finished normally
            out.append(
                {
                    "location": pool["location"],
                    "num_workers": len(states),
                    "workers": states,
                    "pending_batches": pool.get("pending"),
                    "batches_received": pool.get("received"),
                    "batches_per_epoch": pool["per_epoch"],
                }
            )
        return out


def describe_exit(code: int | None) -> str:
    if code is None:
        return "alive"
    if code < 0:
        import signal

        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


def format_stack(thread: dict[str, Any], limit: int = 25) -> str:
    """A thread's stack as text, outermost call first (like a traceback)."""
    frames = thread.get("frames", [])[:limit]
    user = [i for i, f in enumerate(frames) if f.get("user")]
    if user:  # the runpy/bootstrap frames above the script's own are the same in every run
        frames = frames[: user[-1] + 1]
    lines = [f"Thread {thread.get('name')}{' (main)' if thread.get('main') else ''}:"]
    for f in reversed(frames):
        lines.append(f'  File "{f["file"]}", line {f["line"]}, in {f["function"]}')
        if f.get("code"):
            lines.append(f"    {f['code']}")
    return "\n".join(lines)
