"""The child process: install the hooks, run the user's script as ``__main__`` with runpy, report.

    python -m pitstop.profile.process.bootstrap RUN_CONFIG.json

``sys.argv``, ``sys.path[0]`` and ``__main__`` are set as if the script had been run directly. What was
measured is written to ``measurements.json`` in the run's folder: every second while steps run (so a
killed child still leaves data) and once more at the end, with the script's fate (completed, stopped
after the measured steps, exited, raised, interrupted).
"""

from __future__ import annotations

import contextlib
import json
import os
import runpy
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pitstop.profile.process.instrumented import (
    MEASUREMENTS,
    ON_DONE,
    ON_END,
    ON_FINISH,
    ON_INSTALL,
    describe_error,
    finalize,
    make_config,
)
from pitstop.profile.record.measurements import SCHEMA


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    cfg = json.loads(Path(argv[0]).read_text())
    out_dir = Path(cfg["out_dir"])
    # pitstop stops the script with SIGINT (timeout, --steps across ranks, Ctrl-C); started from a
    # background job of a shell without job control, it would inherit SIGINT ignored. The child runs in
    # its own session, so no terminal's Ctrl-C reaches it: only pitstop sends it this signal.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return _main(cfg, out_dir)
    except KeyboardInterrupt:  # Ctrl-C / timeout while torch was still importing: nothing measured yet
        record = {"version": 1, "status": "interrupted", "error": "interrupted before the script started"}
        record.update(schema=SCHEMA, steps=[], exit_code=130)
        (out_dir / MEASUREMENTS).write_text(json.dumps(record))
        os._exit(130)


@dataclass
class _Fate:
    """How the script ended: the record's status, error and traceback, and the exit code."""

    status: str = "completed"
    error: str | None = None
    tb: str | None = None
    code: int = 0


def _main(cfg: dict[str, Any], out_dir: Path) -> int:
    from pitstop.profile.capture.hooks import Instrumentation
    from pitstop.profile.capture.watchdog import Watchdog

    inst = Instrumentation(make_config(cfg, out_dir))
    inst.flush_path = out_dir / MEASUREMENTS
    # launch to the instrumentation's clock origin (python, torch and pitstop imports): part of start-up
    launch_s = max(0.0, time.time() - cfg["launched_at"]) if cfg.get("launched_at") else None
    _set_script_argv(cfg["kind"], cfg["target"], list(cfg["args"]))
    watchdog = Watchdog(inst).start()  # stacks of a hang / slow step, before the script is stopped
    fate = _run_script(inst, cfg, watchdog, out_dir)
    for fn in ON_DONE:
        fn(fate.status)
    watchdog.stop()
    _quiet_sigchld()
    _write_record(inst, _final_record(inst, fate, launch_s))
    if fate.status in (
        "completed",
        "exited",
    ):  # the script ended by itself: its exit handlers run, as in Python
        _run_exit_handlers()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    # os._exit: the script was stopped mid-loop; its leftover threads and atexit handlers must not hang us.
    # DataLoader workers were shut down in finalize, the parent reaps anything else in our process group.
    os._exit(fate.code if 0 <= fate.code <= 255 else 1)


def _set_script_argv(kind: str, target: str, args: list[str]) -> None:
    """``sys.argv`` and ``sys.path[0]`` as if the script (or module) had been run directly."""
    if kind == "module":
        sys.argv = [target, *args]  # run_module(alter_sys=True) replaces argv[0] with the module's file
        sys.path[0] = os.getcwd()
    else:
        sys.argv = [target, *args]
        sys.path[0] = os.path.dirname(os.path.abspath(target))


def _run_script(inst: Any, cfg: dict[str, Any], watchdog: Any, out_dir: Path) -> _Fate:
    """Install the hooks and run the script as ``__main__``; how it ended, whatever it raised."""
    from pitstop.profile.capture.hooks import StopProfiling

    kind, target = cfg["kind"], cfg["target"]
    try:
        try:
            inst.install()
            for fn in ON_INSTALL:
                fn(inst)
            if cfg.get("children"):  # torch.multiprocessing children are measured like ranks
                from pitstop.profile.process.children import follow

                ON_DONE.append(follow(inst, cfg).on_done)
            inst.flush("running")
            if kind == "module":
                runpy.run_module(target, run_name="__main__", alter_sys=True)
            else:
                runpy.run_path(target, run_name="__main__")
        finally:
            for fn in ON_END:
                fn()
    except StopProfiling:
        return _Fate("stopped")
    except SystemExit as e:
        if e.code in (0, None):
            return _Fate()
        return _Fate(
            "exited",
            f"the script exited with status {e.code}",
            None,
            e.code if isinstance(e.code, int) else 1,
        )
    except KeyboardInterrupt:
        return _Fate("interrupted", "interrupted (SIGINT / Ctrl-C)", None, 130)
    except BaseException as e:
        watchdog.note_error()
        return _script_error(inst, e, out_dir)
    return _Fate()


def _script_error(inst: Any, e: BaseException, out_dir: Path) -> _Fate:
    """The fate of a script that raised: the user's file:line and traceback, a CUDA OOM's allocator
    snapshot, and the DataLoader workers that died with it."""
    from pitstop.profile.capture.gpu_memory import save_oom_snapshot

    error, tb = f"{type(e).__name__}: {e}", None
    try:
        _quiet_sigchld()
        error, tb = describe_error(e)
    except BaseException as late:  # e.g. torch's worker-death handler firing while we report
        _quiet_sigchld()
        with contextlib.suppress(Exception):
            error, tb = describe_error(e)  # again, with that handler gone: the user's file:line
        error = f"{error}; then {type(late).__name__}: {late}"
    inst.oom = save_oom_snapshot(e, out_dir)  # CUDA OOM: allocator snapshot next to the report
    # a worker that died mid-batch breaks the pipe the script reads first: give it time to be reaped
    dead = _dead_workers(inst, 1.0 if isinstance(e, ConnectionError | EOFError) else 0.0)
    if dead and "DataLoader worker" not in error:
        error = f"{error}; {dead}"
    e.__traceback__ = None
    return _Fate("error", error, tb, 1)


def _final_record(inst: Any, fate: _Fate, launch_s: float | None) -> dict[str, Any]:
    """The final measurements with the script's fate; the ``ON_FINISH`` hooks add theirs. A failure
    while finishing is noted in ``finalize_error``, never loses what was measured."""
    try:
        data = finalize(inst, fate.status)
    except BaseException as e:  # never lose the measurements over a failure while finishing
        data = inst.snapshot(fate.status, final=False)
        data["finalize_error"] = f"{type(e).__name__}: {e}"
    data.update(
        {
            "status": fate.status,
            "error": fate.error,
            "traceback": fate.tb,
            "exit_code": fate.code,
            "launch_s": launch_s,
        }
    )
    for fn in ON_FINISH:
        try:
            fn(inst, data)
        except BaseException as e:
            data["finalize_error"] = f"{type(e).__name__}: {e}"
    return data


def _write_record(inst: Any, data: dict[str, Any]) -> None:
    """Write the final record, trying again when a late signal handler raises mid-write."""
    from pitstop.profile.record.jsonfile import write_json_atomic

    for _ in range(3):  # a late signal handler raising mid-write must not lose the record
        try:
            write_json_atomic(inst.flush_path, data)
            break
        except BaseException:
            continue


def _run_exit_handlers() -> None:
    import atexit

    with contextlib.suppress(BaseException):
        atexit._run_exitfuncs()


def _dead_workers(inst: Any, wait_s: float = 0.0) -> str | None:
    """'DataLoader worker (pid N) exited with code C' for workers of the script's loaders that died.
    ``wait_s``: how long to give a worker that is still exiting (its end closed the pipe the script read
    from, but the process is not reaped yet) to be seen dead, in all."""
    dead = []
    deadline = time.monotonic() + wait_s
    with contextlib.suppress(Exception):
        for _ref, workers, _loader in inst.worker_pools:
            for w in workers:
                if w.exitcode is None and wait_s > 0:
                    w.join(max(0.0, deadline - time.monotonic()))
                if w.exitcode not in (None, 0):
                    dead.append(f"DataLoader worker (pid {w.pid}) exited with code {w.exitcode}")
    return "; ".join(dead) or None


def _quiet_sigchld() -> None:
    """torch's DataLoader SIGCHLD handler raises in the main thread each time a worker dies; once the
    script is over it would interrupt pitstop's own reporting."""
    with contextlib.suppress(Exception):
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)


if __name__ == "__main__":
    sys.exit(main())
