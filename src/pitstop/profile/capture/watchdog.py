"""Progress watchdog: where the script is when it stops making progress, and what a slow step was doing.

Child side (``Watchdog``): a daemon thread in the profiled process that wakes every ``POLL_S`` and reads
the counters the instrumentation already keeps (steps recorded, ``counts`` of batches, forwards,
backward calls and optimizer steps, and ``clock``: the current step's start, its last optimizer step). Nothing is added to the training loop's hot path.

- **hang**: no progress for longer than max(``HANG_FACTOR`` x the median step, ``HANG_FLOOR_S``): every
  thread's Python stack (``sys._current_frames``), the main thread's innermost user frame and the call
  it is in, DataLoader worker state, threads of the script that died with an exception
  (``threading.excepthook``). If progress resumes, the dump is marked recovered (a stall, not a hang).
- **stall samples**: when the current step has run longer than ``STALL_FACTOR`` x the median step, the
  main thread's stack (again at 2x and 4x that), so a slow step says what was running; and from then
  until the step ends, what the rest of the machine did (``contention``: other processes' CPU outside
  the script's session, steal time, this process's own CPU), so a slow step the machine caused is told
  from one the script caused.
- **stop**: when the parent stops the script (``--timeout``, Ctrl-C) it first asks for a dump
  (``request_stacks``) and waits for it, so the stacks are those of the blocked script, taken before
  SIGINT unwinds it.

Everything goes to ``watchdog.json`` in the run folder; the parent reads it with ``read_watchdog``,
which also decides whether the run ended hung (``hang`` in its result).

``PITSTOP_HANG_FLOOR_S`` (default 30) and ``PITSTOP_WATCHDOG_POLL_S`` (default 0.25) change the floor and
the poll period: tests lower the floor to see a hang in seconds.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import threading
import time
from pathlib import Path
from typing import Any

WATCHDOG_FILE = "watchdog.json"
REQUEST_FILE = "stacks-request"  # the parent writes the reason; the watchdog dumps and removes it
UNANSWERED_FILE = "stacks-unanswered"  # the parent's note that no dump came (main thread holds the GIL)
HANG_FACTOR = 10.0
HANG_FLOOR_S = float(os.environ.get("PITSTOP_HANG_FLOOR_S", "30"))
POLL_S = float(os.environ.get("PITSTOP_WATCHDOG_POLL_S", "0.25"))
STALL_FACTOR = 10.0
STALL_MIN_S = 0.1  # a stall is also at least this much longer than the median step (timer noise)
STOP_HANG_MIN_S = 1.0  # stopped with no progress for this long (and 10 medians): hung, not busy
SAMPLES_PER_STEP = 3
MAX_SAMPLES = 100
MAX_HANG_DUMPS = 5
MAX_WINDOWS = 50  # slow steps whose machine load is measured (each costs a walk over the processes)
REQUEST_WAIT_S = 2.0
clock = time.perf_counter


def median_step_s(records: list[dict[str, Any]]) -> float | None:
    """Median of the recent steps: the measured ones once there are three, else those after the first
    (compilation, allocation, worker start slow the warm-up)."""
    recent = records[-101:]
    measured = [r["total_s"] for r in recent if not r.get("warmup")]
    if len(measured) < 3:
        measured = [r["total_s"] for r in recent if r.get("index", 0) > 0] or [r["total_s"] for r in recent]
    return statistics.median(measured) if measured else None


def runqueue_wait_s() -> float | None:
    """Seconds this process's threads have waited on a run queue for a CPU (Linux schedstat), or None."""
    total, seen = 0.0, False
    with contextlib.suppress(OSError):
        for tid in os.listdir("/proc/self/task"):
            with contextlib.suppress(OSError, ValueError, IndexError):
                with open(f"/proc/self/task/{tid}/schedstat") as f:
                    total += int(f.read().split()[1]) / 1e9
                seen = True
    return total if seen else None


class LoadWindow:
    """What the rest of the machine did from now until ``close``: other processes' CPU (outside this
    process's session, so the script's DataLoader workers and ranks are not 'other'), steal time, this
    process's own CPU, each over the window's wall time, and how long its threads waited for a CPU."""

    def __init__(self, step: int, now: float) -> None:
        import psutil

        from pitstop.host.load import CpuOutsideSession

        self.step, self.t0 = step, now
        self.others = CpuOutsideSession()
        self.steal0 = getattr(psutil.cpu_times(), "steal", 0.0)
        self.own0 = time.process_time()
        self.wait0 = runqueue_wait_s()

    def close(self, now: float) -> dict[str, Any]:
        import psutil

        wall = max(now - self.t0, 1e-9)
        cpus = psutil.cpu_count() or 1
        wait = runqueue_wait_s()
        return {
            "step": self.step,
            "wall_s": wall,
            "cpus": cpus,
            "other_cpu_share": self.others.share(os.getsid(0)),
            "steal_share": max(0.0, getattr(psutil.cpu_times(), "steal", 0.0) - self.steal0) / (wall * cpus),
            "own_cpus": (time.process_time() - self.own0) / wall,
            "runqueue_wait_s": None if self.wait0 is None or wait is None else max(0.0, wait - self.wait0),
        }


class Watchdog:
    """One per profiled process: ``Watchdog(inst).start()`` after the hooks are installed, ``stop()``
    when the script has returned (before the probes, which make no step progress)."""

    def __init__(self, inst: Any, poll_s: float = POLL_S, hang_floor_s: float = HANG_FLOOR_S) -> None:
        self.inst = inst
        self.poll_s = poll_s
        self.hang_floor_s = hang_floor_s
        out = Path(inst.cfg.out_dir)
        self.path = out / WATCHDOG_FILE
        self.request = out / REQUEST_FILE
        self.state: dict[str, Any] = {
            "version": 1,
            "pid": os.getpid(),
            "poll_s": poll_s,
            "hang_floor_s": hang_floor_s,
            "main_ident": threading.main_thread().ident,
            "samples": [],
            "contention": [],
            "hangs": [],
            "stop": None,
            "dead_threads": [],
            "end": None,
            "error": None,
        }
        self._stopping = threading.Event()
        self._write_lock = threading.Lock()  # the watchdog thread and a dying thread's excepthook both write
        self._thread: threading.Thread | None = None
        self._key: tuple[Any, ...] | None = None
        self._progress_at = clock()
        self._median: float | None = None
        self._median_n = -1
        self._sample_step = -1
        self._sampled = 0
        self._window: LoadWindow | None = None
        self._open_hang: dict[str, Any] | None = None
        self._hang_key: tuple[Any, ...] | None = None
        self._prev_excepthook: Any = None
        from pitstop.profile.capture.stacks import WorkerPools

        self.pools = WorkerPools()

    # ------------------------------------------------------------------------------ lifecycle
    def start(self) -> Watchdog:
        self._prev_excepthook = threading.excepthook
        threading.excepthook = self._excepthook
        self._write()
        self._thread = threading.Thread(target=self._run, name="pitstop-watchdog", daemon=True)
        self._thread.start()
        return self

    def note_error(self) -> None:
        """The script raised: record its DataLoader workers now, while a dead worker is still a zombie
        whose exit code can be read (signal handlers and shutdown may reap it before ``stop``)."""
        with contextlib.suppress(Exception):
            self.pools.track(self.inst.worker_pools)
            self.state["error"] = {"at_s": clock() - self.inst.t0, "loaders": self.pools.state(reap=False)}

    def stop(self) -> None:
        """Stop the thread, undo the excepthook, record the DataLoader workers as the script left them."""
        self._stopping.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=2 * self.poll_s + 1.0)
        if threading.excepthook == self._excepthook:
            threading.excepthook = self._prev_excepthook
        with contextlib.suppress(Exception):  # nothing here may cost the script's report
            self.pools.track(self.inst.worker_pools)
            self.state["end"] = {"at_s": clock() - self.inst.t0, "loaders": self.pools.state(reap=True)}
        with contextlib.suppress(Exception):
            self._answer_request(clock())  # a stop asked for while the script was returning
        with contextlib.suppress(Exception):
            self._close_window(clock())
        self._write()

    def _excepthook(self, args: Any) -> None:
        """A thread of the script died with an exception: noted (a queue.get waiting on it hangs), then
        the previous hook prints it as Python would."""
        with contextlib.suppress(Exception):
            import traceback

            from pitstop.profile.capture.where import is_user_file, location

            tb = traceback.extract_tb(args.exc_traceback)
            user = [fs for fs in tb if is_user_file(fs.filename)]
            fs = user[-1] if user else (tb[-1] if tb else None)
            self.state["dead_threads"].append(
                {
                    "name": getattr(args.thread, "name", None),
                    "error": f"{args.exc_type.__name__}: {args.exc_value}",
                    "where": location(fs.filename, fs.lineno or 0) if fs is not None else None,
                    "at_s": clock() - self.inst.t0,
                }
            )
            self._write()
        self._prev_excepthook(args)

    # ---------------------------------------------------------------------------------- loop
    def _run(self) -> None:
        while not self._stopping.wait(self.poll_s):
            try:
                self._tick(clock())
            except Exception as e:  # never take the script down; say why the watchdog went quiet
                self.state["error"] = f"{type(e).__name__}: {e}"
                self._write()
                return

    def _progress_key(self) -> tuple[Any, ...]:
        inst = self.inst
        c = inst.counts
        return (len(inst.records), c["batches"], c["forwards"], c["backwards"], c["optimizer_steps"])

    def _tick(self, now: float) -> None:
        inst = self.inst
        key = self._progress_key()
        if key != self._key:
            self._key, self._progress_at = key, now
            if self._open_hang is not None:
                self._open_hang["recovered_after_s"] = now - inst.t0 - self._open_hang["at_s"]
                self._open_hang = None
                self._write()
        n = key[0]
        if n != self._median_n:
            self._median, self._median_n = median_step_s(inst.records), n
        self.pools.track(inst.worker_pools)
        self._answer_request(now)
        if self._callback_running():
            return  # a tune callback runs its own loops inside the script: not the script's progress
        med = self._median
        start = inst.clock.step_start
        if med is not None and start is not None:
            if n != self._sample_step:
                self._close_window(now)  # the slow step ended
                self._sample_step, self._sampled = n, 0
            limit = max(STALL_FACTOR * med, med + STALL_MIN_S) * 2**self._sampled
            if (
                self._sampled < SAMPLES_PER_STEP
                and now - start > limit
                and len(self.state["samples"]) < MAX_SAMPLES
            ):
                if self._sampled == 0 and len(self.state["contention"]) < MAX_WINDOWS:
                    self._window = LoadWindow(n, now)
                self._sample(now, n, now - start)
        limit = max(HANG_FACTOR * med if med else 0.0, self.hang_floor_s)
        if self._open_hang is None and key != self._hang_key and now - self._progress_at > limit:
            self._hang_key = key
            dump = self.dump("hang", now, limit)
            self._open_hang = dump
            hangs = self.state["hangs"]
            hangs.append(dump)
            del hangs[:-MAX_HANG_DUMPS]
            self._write()

    def _close_window(self, now: float) -> None:
        if self._window is not None:
            window, self._window = self._window, None
            self.state["contention"].append(window.close(now))
            self._write()

    def _callback_running(self) -> bool:
        return bool(self.inst.callback_requested and self.inst.cfg.callback is None)

    def _sample(self, now: float, step: int, elapsed: float) -> None:
        from pitstop.profile.capture.stacks import describe, main_thread_frames

        frames = main_thread_frames()
        self._sampled += 1
        self.state["samples"].append(
            {
                "step": step,
                "at_s": now - self.inst.t0,
                "elapsed_s": elapsed,
                "main": describe(frames),
                "frames": frames,
            }
        )
        self._write()

    def _answer_request(self, now: float) -> None:
        if not self.request.exists():
            return
        try:
            reason = self.request.read_text().strip() or "stop"
        except OSError:
            return
        if self.state["stop"] is None:
            self.state["stop"] = self.dump(reason, now, None)
        self._write()
        with contextlib.suppress(OSError):
            self.request.unlink()

    # ---------------------------------------------------------------------------------- dumps
    def dump(self, reason: str, now: float, threshold: float | None) -> dict[str, Any]:
        """Every thread's stack and the state of progress, as of ``now``."""
        from pitstop.profile.capture.stacks import all_threads

        inst = self.inst
        records = inst.records
        skip = {self._thread.ident} if self._thread is not None and self._thread.ident else set()
        threads = all_threads(skip)
        main = next((t for t in threads if t["main"]), None)
        return {
            "reason": reason,
            "at_s": now - inst.t0,
            "since_progress_s": now - self._progress_at,
            "median_step_s": self._median,
            "threshold_s": threshold,
            "steps_done": len(records),
            "warmup": inst.cfg.warmup,
            "last_step": _last_step(inst, now),
            "batches": inst.counts["batches"],
            "forwards": inst.counts["forwards"],
            "main": main["blocked"] if main else None,
            "threads": threads,
            "loaders": self.pools.state(reap=False),
            "dead_threads": list(self.state["dead_threads"]),
            "callback_running": self._callback_running(),
        }

    def _write(self) -> None:
        from pitstop.profile.record.jsonfile import write_json_atomic

        with self._write_lock, contextlib.suppress(Exception):
            write_json_atomic(self.path, self.state)


def _last_step(inst: Any, now: float) -> dict[str, Any] | None:
    """The last step whose work finished (optimizer.step(), or backward in loops without an optimizer):
    the open one when it did (its end, the next boundary, has not come), else the last recorded.
    ``index`` counts from 0."""
    records = inst.records
    end = inst.clock.pending_end()
    if end is not None:
        return {"index": len(records), "ended_s_ago": now - end}
    if not records:
        return None
    last = records[-1]
    return {"index": last["index"], "ended_s_ago": now - inst.t0 - last["start_s"] - last["total_s"]}


# ---------------------------------------------------------------------------------------- parent side


def request_stacks(out_dir: Path, reason: str, wait_s: float = REQUEST_WAIT_S, alive: Any = None) -> bool:
    """Ask the child's watchdog for a dump before the script is stopped; True when it answered. No-op
    (False) when the child never started its watchdog; ``alive()`` False ends the wait. When it does not answer within ``wait_s`` (its
    thread cannot get the GIL: the main thread is stuck in native code holding it) that is noted."""
    out_dir = Path(out_dir)
    if not (out_dir / WATCHDOG_FILE).exists():
        return False
    req = out_dir / REQUEST_FILE
    try:
        req.write_text(reason)
    except OSError:
        return False
    end = time.monotonic() + wait_s
    while req.exists() and time.monotonic() < end and (alive is None or alive()):
        time.sleep(0.02)
    if req.exists() and (alive is None or alive()):
        with contextlib.suppress(OSError):
            req.unlink()
            (out_dir / UNANSWERED_FILE).write_text(f"no answer in {wait_s:g} s")
        return False
    return True


def read_watchdog(out_dir: Path, status: str) -> dict[str, Any]:
    """What the child's watchdog recorded ({} when nothing), with ``run_status`` and the verdict
    ``hang``: the dump that shows the script blocked when it was stopped, or None."""
    out_dir = Path(out_dir)
    try:
        wd = json.loads((out_dir / WATCHDOG_FILE).read_text())
    except (OSError, ValueError):
        return {}
    wd["run_status"] = status
    wd["unanswered"] = (out_dir / UNANSWERED_FILE).exists()
    wd["hang"] = hang_verdict(wd, status)
    return wd


def hang_verdict(wd: dict[str, Any], status: str) -> dict[str, Any] | None:
    """The run ended hung: stopped (timeout, Ctrl-C, killed) with no progress for longer than
    max(10 x median step, 1 s) at the stop, or after a hang dump that never recovered."""
    if status not in ("timeout", "interrupted", "killed"):
        return None
    stop = wd.get("stop")
    if stop is not None:
        if stop.get("callback_running"):
            return None
        med = stop.get("median_step_s")
        need = max(HANG_FACTOR * med, STOP_HANG_MIN_S) if med else STOP_HANG_MIN_S
        return stop if stop["since_progress_s"] >= need else None  # else: cut short while progressing
    open_hangs = [h for h in wd.get("hangs") or [] if h.get("recovered_after_s") is None]
    return open_hangs[-1] if open_hangs and not open_hangs[-1].get("callback_running") else None


def hang_summary(wd: dict[str, Any]) -> str | None:
    """'hung at train.py:40 in time.sleep: no progress for 24.3 s' for the run's error line."""
    dump = (wd or {}).get("hang")
    if not dump:
        return None
    main = dump.get("main") or {}
    where = main.get("where") or "an unknown place"
    call = f" in {main['call']}" if main.get("call") else ""
    return f"hung at {where}{call}: no progress for {dump['since_progress_s']:.1f} s"
