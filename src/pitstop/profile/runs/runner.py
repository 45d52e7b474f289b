"""Run a user's training script, unmodified, in a child process with pitstop's instrumentation.

``run(spec, out_dir=None, progress=None)`` starts ``python -m pitstop.profile.process.bootstrap`` in its own
session with the ``RunSpec`` as JSON, waits for it (``supervise``: progress, ``--timeout``, Ctrl-C and
SIGTERM stop the child cleanly, SIGKILL after ``supervise.GRACE_S``) and returns a ``RunResult``
(``pitstop.profile.runs.result``). ``profile``, ``tune`` and ``fix`` all run scripts through it.

- ``RunSpec.probes`` (default True): after the script stops, time fp32 vs autocast, NCHW vs
  channels_last, for-loop vs foreach optimizer on the script's own model and last batch, so rules can
  state measured savings. Skipped automatically when ``overrides`` or ``callback`` are set.
- ``RunSpec.quiet``: the script's stdout/stderr go to ``stdout.txt``/``stderr.txt`` in the run folder
  instead of the terminal. ``RunSpec.stdout_to_stderr``: the script's stdout goes to our stderr
  (``--json -`` keeps stdout for the report).
- ``progress(steps_so_far, warmup + steps)`` is called each time the child's periodic record changes
  (about once a second); steps_so_far includes warm-up steps.
- ``RunResult.status``: "completed" | "stopped" | "exited" | "error" | "interrupted" | "timeout" |
  "killed" | "not_started"; ``stopped`` is the clean stop after ``steps`` (or after the callback).
- ``RunResult.warmup_steps``, ``RunResult.data`` (the raw measurements), ``RunResult.out_dir``,
  ``RunResult.trace_path``, ``RunResult.ok`` (script did not fail).
- ``RunResult.hang``: when the script was stopped (timeout, Ctrl-C, killed) blocked, the watchdog's dump
  (``pitstop.profile.capture.watchdog``): ``main`` (``where`` file:line, ``call``, ``kind``), ``threads`` with
  their stacks, ``since_progress_s``, ``last_step``, ``loaders``, ``dead_threads``; None otherwise. The
  run's ``error`` then starts "hung at FILE:LINE in CALL", which ``fix`` and ``tune`` report as is.

The callback gets ``pitstop.profile.capture.hooks.Captured``; it is called once (``callback_at="loader"``: right
after the first DataLoader is constructed; ``"step"``: when the warm-up steps are done), then the script
is stopped with ``pitstop.profile.StopProfiling`` and the run counts as a clean stop. A callback that
raises, or returns something that is not JSON-serialisable, leaves ``callback_result`` None and says why
in ``RunResult.error``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pitstop.host.load import CpuOutsideSession
from pitstop.profile.capture.watchdog import REQUEST_WAIT_S, request_stacks
from pitstop.profile.process.children import CLAIMS as CHILD_CLAIMS
from pitstop.profile.process.command import CommandError, launcher_for, parse_command
from pitstop.profile.runs.result import MEASUREMENTS, RunResult, RunSpec, note_other_cpu, read_measurements
from pitstop.profile.runs.supervise import grace_s, supervise, wait_or_kill

CONFIG = "run-config.json"
INTERRUPT_STACKS_S = 0.5  # Ctrl-C / SIGTERM: how long the watchdog gets to dump the stacks


# ------------------------------------------------------------------------------------------------ run


def stop_on_interrupt(runner: Callable[[RunSpec], RunResult]) -> Callable[[RunSpec], RunResult]:
    """``runner`` for commands that run the script many times (fresh runs, fix, --verify): a run that
    Ctrl-C or SIGTERM stopped (status "interrupted") raises KeyboardInterrupt once the child has written
    what it measured, so the command stops there instead of starting the next run."""

    def guarded(spec: RunSpec) -> RunResult:
        r = runner(spec)
        if r.status == "interrupted":
            raise KeyboardInterrupt
        return r

    return guarded


def run(
    spec: RunSpec,
    out_dir: Path | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> RunResult:
    """Run the script in a child process and collect what it measured. Never raises for the script's
    own failures (they land in ``RunResult.error``); a command that cannot start gives status
    "not_started" and returncode 2."""
    start = time.perf_counter()
    try:
        kind, target, args = parse_command(spec.command, spec.cwd)
    except CommandError as e:
        return _empty(spec, str(e), "not_started", 2, time.perf_counter() - start)
    launcher = launcher_for(kind, target, args)
    if launcher is not None:  # torchrun / accelerate launch: every rank instrumented
        from pitstop.profile.runs.ranks import run_ranks

        return run_ranks(spec, kind, target, args, launcher, out_dir, progress)
    temp = out_dir is None
    out = Path(tempfile.mkdtemp(prefix="pitstop-profile-")) if out_dir is None else Path(out_dir)
    _write_config(spec, out, kind, target, args)
    stdout, stderr = _child_streams(spec, out)
    other = CpuOutsideSession()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pitstop.profile.process.bootstrap", str(out / CONFIG)],
            cwd=spec.cwd,
            env=_child_env(spec),
            stdout=stdout,
            stderr=stderr,
            start_new_session=True,  # our own process group: Ctrl-C and kills reach the whole tree
        )
    except OSError as e:
        return _empty(spec, f"could not start the script: {e}", "not_started", 2, time.perf_counter() - start)
    tick = _ProgressTick(out, progress, spec.warmup + spec.steps)
    try:
        status_override = supervise(proc, tick, spec.timeout, lambda reason: _stop(proc, out, reason))
    finally:
        for fh in (stdout, stderr):
            if fh is not None and not isinstance(fh, int):
                fh.close()
        _reap_group(proc)
    returncode = proc.returncode if proc.returncode is not None else -9
    result = read_measurements(
        spec, out / MEASUREMENTS, returncode, status_override, time.perf_counter() - start
    )
    return _finish(spec, result, out, other, proc.pid, temp)


def _write_config(spec: RunSpec, out: Path, kind: str, target: str, args: list[str]) -> None:
    """Make the run folder ready for a fresh child: no earlier measurements or children, and the
    ``CONFIG`` the bootstrap reads."""
    out.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        (out / MEASUREMENTS).unlink()
    cfg = {
        "kind": kind,
        "target": target,
        "args": args,
        "steps": spec.steps,
        "warmup": spec.warmup,
        "full": spec.full,
        "trace": spec.trace,
        "overrides": spec.overrides.to_dict(),
        "callback": spec.callback,
        "callback_at": spec.callback_at,
        "out_dir": str(out.resolve()),
        "probes": spec.probes,
        "children": True,  # torch.multiprocessing children measured like ranks (pitstop.profile.process.children)
        "launched_at": time.time(),  # the child's start-up is timed from here (pitstop.profile.confirm.budget)
    }
    for old in [*out.glob("rank-*"), out / CHILD_CLAIMS]:  # an earlier run's children
        shutil.rmtree(old, ignore_errors=True)
    (out / CONFIG).write_text(json.dumps(cfg, indent=2))


def _child_env(spec: RunSpec) -> dict[str, str]:
    """The child's environment: ours plus ``spec.env``, with this pitstop first on PYTHONPATH."""
    env = {**os.environ, **spec.env}
    # the child must import this pitstop, whatever the script's directory holds
    src = str(Path(__file__).resolve().parents[3])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    return env


def _child_streams(spec: RunSpec, out: Path) -> tuple[Any, Any]:
    """The child's stdout and stderr: inherited (None), our stderr's descriptor, or files in the run
    folder when quiet (the caller closes them)."""
    stdout: Any = None
    stderr: Any = None
    if spec.stdout_to_stderr:
        stdout = sys.stderr.fileno()
    if spec.quiet:
        stdout = open(out / "stdout.txt", "wb")  # noqa: SIM115 - closed by run
        stderr = open(out / "stderr.txt", "wb")  # noqa: SIM115
    return stdout, stderr


class _ProgressTick:
    """``supervise``'s tick: calls ``progress`` when the child's periodic record (or, training in
    children, the slowest child's step count) has changed since the last call."""

    def __init__(self, out: Path, progress: Callable[[int, int], None] | None, total_steps: int) -> None:
        self.out = out
        self.progress = progress
        self.total_steps = total_steps
        self.seen: Any = None

    def __call__(self) -> None:
        from pitstop.profile.runs import children_report

        if self.progress is None:
            return
        measurements = self.out / MEASUREMENTS
        kids = children_report.steps_so_far(self.out)  # training in children: the slowest child's steps
        with contextlib.suppress(OSError):
            now = kids if kids is not None else measurements.stat().st_mtime
            if now != self.seen:
                self.seen = now
                self.progress(kids if kids is not None else _steps_so_far(measurements), self.total_steps)


def _finish(
    spec: RunSpec, result: RunResult, out: Path, other: CpuOutsideSession, pid: int, temp: bool
) -> RunResult:
    """The measured result completed: a killed quiet run's stderr tail, the CPU load outside the
    child's session, its children's measurements; a temporary run folder removed unless traced."""
    from pitstop.profile.runs import children_report

    if spec.quiet and result.status == "killed" and not result.data:
        tail = _tail(out / "stderr.txt")
        if tail:
            result.error = f"{result.error}; its stderr ends with:\n{tail}"
    note_other_cpu(result, other, pid)  # its own session: start_new_session
    result = children_report.collect(spec, result, out)
    result.out_dir = None if temp and not spec.trace else out
    if temp and not spec.trace:
        shutil.rmtree(out, ignore_errors=True)
    return result


def _stop(proc: subprocess.Popen[bytes], out: Path, reason: str) -> None:
    """The watchdog's stack dump, SIGINT (the script sees KeyboardInterrupt and pitstop writes what it
    measured), then SIGKILL after the grace period (``grace_s``) or at a second Ctrl-C."""
    from pitstop.profile.runs import children_report

    user = reason == "interrupted"
    with contextlib.suppress(KeyboardInterrupt):
        wait = INTERRUPT_STACKS_S if user else REQUEST_WAIT_S
        request_stacks(out, reason, wait_s=wait, alive=lambda: proc.poll() is None)
        children_report.request_stacks(out, reason, wait)  # training in children: theirs too
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGINT)
    wait_or_kill(proc, grace_s(reason))


def _reap_group(proc: subprocess.Popen[bytes]) -> None:
    """Whatever the script left running in its process group (workers, pools) goes with it."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    if proc.returncode is None:
        with contextlib.suppress(Exception):
            proc.wait(timeout=5)


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _steps_so_far(path: Path) -> int:
    try:
        data = json.loads(path.read_text())
        return int(data.get("steps_count") or len(data.get("steps") or []))
    except (OSError, ValueError):
        return 0


def _empty(spec: RunSpec, error: str, status: str, code: int, wall: float) -> RunResult:
    return RunResult(
        returncode=code,
        error=error,
        steps=[],
        losses=[],
        config={},
        callback_result=None,
        wall_s=wall,
        status=status,
        command=list(spec.command),
        spec=spec,
    )
