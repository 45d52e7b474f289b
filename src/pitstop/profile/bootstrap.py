"""The child process: install the hooks, run the user's script as ``__main__`` with runpy, report.

    python -m pitstop.profile.bootstrap RUN_CONFIG.json

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
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # hooks imports torch: not before main() can report an interrupted import
    from pitstop.profile.hooks import Config

MEASUREMENTS = "measurements.json"
# extensions in the child (pitstop.profile.rank_worker): fn(inst) after install, fn(inst, data) before the
# final record is written
ON_INSTALL: list[Any] = []
ON_FINISH: list[Any] = []
# fn() the moment the script has ended, however it ended (before the report is made)
ON_END: list[Any] = []
# fn(model) -> (model to probe or None, why not): a rank of a launch probes a copy outside DDP, or none
ON_PROBES: list[Any] = []
# fn(status) once the script's fate is known, before the report is made (its children finish: children.py)
ON_DONE: list[Any] = []


def _describe_error(e: BaseException) -> tuple[str, str]:
    """A one-line quote of the exception with the innermost user file:line, and the traceback text."""
    from pitstop.profile.where import is_user_file

    where = None
    for fs in reversed(traceback.extract_tb(e.__traceback__)):
        if is_user_file(fs.filename):
            where = f"{os.path.relpath(fs.filename)}:{fs.lineno}"
            break
    if isinstance(e, SyntaxError) and e.filename:
        where = f"{e.filename}:{e.lineno}"
    message = e.msg if isinstance(e, SyntaxError) and e.msg else str(e)  # its str repeats file and line
    text = f"{type(e).__name__}: {message}" + (f" (at {where})" if where else "")
    # The frames of pitstop and runpy above the user's first frame are not the user's traceback (a
    # SyntaxError has no user frame at all: only its file, line and caret remain).
    te = traceback.TracebackException.from_exception(e)
    first = next((i for i, fs in enumerate(te.stack) if is_user_file(fs.filename)), len(te.stack))
    te.stack = traceback.StackSummary.from_list(list(te.stack)[first:])
    lines = "".join(te.format()).splitlines(keepends=True)
    return text, "".join(lines[-60:])


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
        (out_dir / MEASUREMENTS).write_text(json.dumps({**record, "steps": [], "exit_code": 130}))
        os._exit(130)


def make_config(cfg: dict[str, Any], out_dir: Path) -> Config:
    """The instrumentation's ``Config`` from a run's settings (the run-config JSON)."""
    from pitstop.profile.hooks import Config
    from pitstop.profile.overrides import Overrides

    return Config(
        steps=int(cfg["steps"]),
        warmup=int(cfg["warmup"]),
        full=bool(cfg["full"]),
        trace=bool(cfg["trace"]),
        overrides=Overrides.from_dict(cfg.get("overrides")),
        callback=cfg.get("callback"),
        callback_at=cfg.get("callback_at", "loader"),
        out_dir=out_dir,
        probes=bool(cfg.get("probes", True)),
    )


def _main(cfg: dict[str, Any], out_dir: Path) -> int:
    from pitstop.profile.gpu_memory import save_oom_snapshot
    from pitstop.profile.hooks import Instrumentation, StopProfiling, write_json_atomic
    from pitstop.profile.watchdog import Watchdog

    inst = Instrumentation(make_config(cfg, out_dir))
    inst.flush_path = out_dir / MEASUREMENTS
    # launch to the instrumentation's clock origin (python, torch and pitstop imports): part of start-up
    launch_s = max(0.0, time.time() - cfg["launched_at"]) if cfg.get("launched_at") else None

    kind, target, args = cfg["kind"], cfg["target"], list(cfg["args"])
    if kind == "module":
        sys.argv = [target, *args]  # run_module(alter_sys=True) replaces argv[0] with the module's file
        sys.path[0] = os.getcwd()
    else:
        sys.argv = [target, *args]
        sys.path[0] = os.path.dirname(os.path.abspath(target))

    status, error, tb, code = "completed", None, None, 0
    watchdog = Watchdog(inst).start()  # stacks of a hang / slow step, before the script is stopped
    try:
        try:
            inst.install()
            for fn in ON_INSTALL:
                fn(inst)
            if cfg.get("children"):  # torch.multiprocessing children are measured like ranks
                from pitstop.profile.children import follow

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
        status = "stopped"
    except SystemExit as e:
        if e.code in (0, None):
            status = "completed"
        else:
            status, code = "exited", e.code if isinstance(e.code, int) else 1
            error = f"the script exited with status {e.code}"
    except KeyboardInterrupt:
        status, code, error = "interrupted", 130, "interrupted (SIGINT / Ctrl-C)"
    except BaseException as e:
        watchdog.note_error()
        status, code = "error", 1
        error = f"{type(e).__name__}: {e}"
        try:
            _quiet_sigchld()
            error, tb = _describe_error(e)
        except BaseException as late:  # e.g. torch's worker-death handler firing while we report
            _quiet_sigchld()
            with contextlib.suppress(Exception):
                error, tb = _describe_error(e)  # again, with that handler gone: the user's file:line
            error = f"{error}; then {type(late).__name__}: {late}"
        inst.oom = save_oom_snapshot(e, out_dir)  # CUDA OOM: allocator snapshot next to the report
        # a worker that died mid-batch breaks the pipe the script reads first: give it time to be reaped
        dead = _dead_workers(inst, 1.0 if isinstance(e, ConnectionError | EOFError) else 0.0)
        if dead and "DataLoader worker" not in error:
            error = f"{error}; {dead}"
        e.__traceback__ = None
    for fn in ON_DONE:
        fn(status)
    watchdog.stop()
    _quiet_sigchld()
    try:
        data = finalize(inst, status)
    except BaseException as e:  # never lose the measurements over a failure while finishing
        data = inst.snapshot(status, final=False)
        data["finalize_error"] = f"{type(e).__name__}: {e}"
    data.update({"status": status, "error": error, "traceback": tb, "exit_code": code, "launch_s": launch_s})
    for fn in ON_FINISH:
        try:
            fn(inst, data)
        except BaseException as e:
            data["finalize_error"] = f"{type(e).__name__}: {e}"
    for _ in range(3):  # a late signal handler raising mid-write must not lose the record
        try:
            write_json_atomic(inst.flush_path, data)
            break
        except BaseException:
            continue
    if status in ("completed", "exited"):  # the script ended by itself: its exit handlers run, as in Python
        _run_exit_handlers()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    # os._exit: the script was stopped mid-loop; its leftover threads and atexit handlers must not hang us.
    # DataLoader workers were shut down in finalize, the parent reaps anything else in our process group.
    os._exit(code if 0 <= code <= 255 else 1)


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


def finalize(inst: Any, status: str, stop_workers: bool = True) -> dict[str, Any]:
    """Uninstall, read what the run left (CUDA events, losses, facts), run the probes. ``stop_workers``
    False keeps the script's DataLoader workers (in-process profiling: the script goes on using them)."""
    import torch

    from pitstop.profile.facts import finish_optimizer_facts
    from pitstop.profile.hooks import write_json_atomic
    from pitstop.profile.loaders import shutdown_loader_workers

    inst.close_pending()
    inst.uninstall()
    if inst.captured.device is None:  # data made on the device directly: take the model's device
        for m in inst.captured.models:
            p = next(m.parameters(), None)
            if p is not None and not p.is_cpu:
                inst.captured.device = p.device
                break
    if stop_workers:
        shutdown_loader_workers(inst.loaders)
    if inst.gpu_sampler is not None:
        inst.gpu_sampler.stop()
    cuda = inst.captured.device is not None and inst.captured.device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        for rec, events in zip(inst.records, inst.h2d_events, strict=False):
            if events:
                rec["h2d_gpu_s"] = sum(s.elapsed_time(e) for s, e in events) / 1000.0
    losses: list[float | None] = []
    for t in inst.losses:
        try:
            losses.append(None if t is None else float(t.float().mean()))
        except Exception:
            losses.append(None)
    finish_optimizer_facts(inst.captured.optimizers, inst.optimizer_facts)
    trace = None
    if inst.tracer is not None:
        inst.tracer.finish()
        trace = inst.tracer.summary()
    inst.device_timer.finish()  # CUDA phase events: read the rest, anchor on the host clock
    data = inst.snapshot(status)
    probes: dict[str, Any] | None = None
    if (
        status in ("completed", "stopped")
        and inst.cfg.probes
        and not inst.callback_requested
        and inst.cfg.overrides.is_empty()
        and inst.records
    ):
        from pitstop.profile.mfu import measure as measure_mfu
        from pitstop.profile.probes import run_probes

        if inst.flush_path is not None:
            write_json_atomic(inst.flush_path, {**data, "status": "probing", "losses": losses})
        model = inst.captured.models[0] if inst.captured.models else None
        facts = data["models"][0] if data["models"] else {}
        why_not = None
        for fn in ON_PROBES:
            model, why_not = fn(model)
        t_probes = time.perf_counter()
        try:
            probes = run_probes(
                model,
                inst.captured.last_inputs,
                facts,
                list(zip(inst.captured.optimizers, inst.optimizer_facts, strict=False)),
                loaders=inst.captured.loaders if stop_workers else None,  # in-process: the script goes on
            )
        except Exception as e:
            probes = {"error": f"{type(e).__name__}: {e}"}
        if why_not:
            probes.setdefault("skipped", []).append(f"model: {why_not}")
        data["mfu"] = measure_mfu(model, inst.captured.last_inputs, facts, probes)  # FLOPs/step vs peak
        data["probes_s"] = time.perf_counter() - t_probes  # the MFU's matmul peak included
    data.update({"losses": losses, "trace": trace, "probes": probes})
    return data


if __name__ == "__main__":
    sys.exit(main())
