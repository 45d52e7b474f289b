"""Run a user's training script, unmodified, in a child process with pitstop's instrumentation.

``run(spec, out_dir=None, progress=None)`` starts ``python -m pitstop.profile.bootstrap`` in its own
session with the ``RunSpec`` as JSON, waits for it (``supervise``: progress, ``--timeout``, Ctrl-C and
SIGTERM stop the child cleanly, SIGKILL after ``GRACE_S``) and returns a ``RunResult``. ``profile``,
``tune`` and ``fix`` all run scripts through it.

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
  (``pitstop.profile.watchdog``): ``main`` (``where`` file:line, ``call``, ``kind``), ``threads`` with
  their stacks, ``since_progress_s``, ``last_step``, ``loaders``, ``dead_threads``; None otherwise. The
  run's ``error`` then starts "hung at FILE:LINE in CALL", which ``fix`` and ``tune`` report as is.

The callback gets ``pitstop.profile.hooks.Captured``; it is called once (``callback_at="loader"``: right
after the first DataLoader is constructed; ``"step"``: when the warm-up steps are done), then the script
is stopped with ``pitstop.profile.StopProfiling`` and the run counts as a clean stop. A callback that
raises, or returns something that is not JSON-serialisable, leaves ``callback_result`` None and says why
in ``RunResult.error``.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pitstop.findings import Report
from pitstop.host.load import CpuOutsideSession
from pitstop.interrupts import sigterm_interrupts
from pitstop.profile.command import CommandError, launcher_for, parse_command
from pitstop.profile.overrides import Overrides
from pitstop.profile.timeline import StepRecord, steps_from_log, steps_per_s
from pitstop.profile.watchdog import REQUEST_WAIT_S, hang_summary, read_watchdog, request_stacks

MEASUREMENTS = "measurements.json"
CONFIG = "run-config.json"
GRACE_S = 20.0  # after SIGINT at a timeout: time for the child to write what it measured
# Ctrl-C / SIGTERM: the user waits, so the child gets less (pitstop stops within 2 s in all); a child that
# has not written its final record by then is killed, and its last periodic record is what was measured
INTERRUPT_GRACE_S, INTERRUPT_STACKS_S = 1.0, 0.5
POLL_S = 0.25


@dataclass
class RunSpec:
    command: list[str]
    steps: int = 30
    warmup: int = 5
    full: bool = False
    timeout: float | None = None
    trace: bool = False
    overrides: Overrides = field(default_factory=Overrides)
    callback: str | None = None
    callback_at: str = "loader"
    cwd: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    probes: bool = True
    quiet: bool = False
    stdout_to_stderr: bool = False


@dataclass
class RunResult:
    returncode: int
    error: str | None
    steps: list[StepRecord]
    losses: list[float]
    config: dict[str, Any]
    callback_result: Any
    wall_s: float
    status: str = "completed"
    warmup_steps: list[StepRecord] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)
    out_dir: Path | None = None
    command: list[str] = field(default_factory=list)
    spec: RunSpec | None = None
    hang: dict[str, Any] | None = None  # the watchdog's dump when the run was stopped hung (runner doc)

    @property
    def ok(self) -> bool:
        return self.status in ("completed", "stopped")

    @property
    def trace_path(self) -> str | None:
        trace = self.data.get("trace") or {}
        return trace.get("path")

    def steps_per_s(self) -> float:
        """Throughput: the measured steps over their wall seconds, slow ones included (0.0 when none)."""
        return steps_per_s(self.steps)

    def median_step_s(self) -> float | None:
        return statistics.median(s.total_s for s in self.steps) if self.steps else None

    def report(self) -> Report:
        from pitstop.profile.rules import build_report

        return build_report(self)


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


def note_other_cpu(result: RunResult, other: CpuOutsideSession, session: int) -> None:
    """Other processes' share of the CPUs over the run (at least: ``CpuOutsideSession``), and the
    hypervisor's steal, into ``result.data`` and each rank's (its findings are built from its own);
    ``session``: the script's, whose processes are its own."""
    shares = {"other_cpu_share": round(other.share(session), 4), "steal_share": round(other.steal_share(), 4)}
    result.data.update(shares)
    for rank in (getattr(result, "ranks", None) or {}).values():
        rank.data.update(shares)


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
    from pitstop.profile import children_report

    if launcher is not None:  # torchrun / accelerate launch: every rank instrumented
        from pitstop.profile.ranks import run_ranks

        return run_ranks(spec, kind, target, args, launcher, out_dir, progress)
    temp = out_dir is None
    out = Path(tempfile.mkdtemp(prefix="pitstop-profile-")) if out_dir is None else Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    measurements = out / MEASUREMENTS
    with contextlib.suppress(FileNotFoundError):
        measurements.unlink()
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
        "children": True,  # torch.multiprocessing children measured like ranks (pitstop.profile.children)
        "launched_at": time.time(),  # the child's start-up is timed from here (pitstop.profile.budget)
    }
    for old in out.glob("rank-*"):  # an earlier run's children
        shutil.rmtree(old, ignore_errors=True)
    (out / CONFIG).write_text(json.dumps(cfg, indent=2))
    env = {**os.environ, **spec.env}
    # the child must import this pitstop, whatever the script's directory holds
    src = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    stdout: Any = None
    stderr: Any = None
    if spec.stdout_to_stderr:
        stdout = sys.stderr.fileno()
    if spec.quiet:
        stdout = open(out / "stdout.txt", "wb")  # noqa: SIM115 - closed below
        stderr = open(out / "stderr.txt", "wb")  # noqa: SIM115
    other = CpuOutsideSession()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pitstop.profile.bootstrap", str(out / CONFIG)],
            cwd=spec.cwd,
            env=env,
            stdout=stdout,
            stderr=stderr,
            start_new_session=True,  # our own process group: Ctrl-C and kills reach the whole tree
        )
    except OSError as e:
        return _empty(spec, f"could not start the script: {e}", "not_started", 2, time.perf_counter() - start)
    total_steps = spec.warmup + spec.steps
    seen: Any = None

    def tick() -> None:
        nonlocal seen
        if progress is not None:
            kids = children_report.steps_so_far(out)  # training in children: the slowest child's steps
            with contextlib.suppress(OSError):
                now = kids if kids is not None else measurements.stat().st_mtime
                if now != seen:
                    seen = now
                    progress(kids if kids is not None else _steps_so_far(measurements), total_steps)

    try:
        status_override = supervise(proc, tick, spec.timeout, lambda reason: _stop(proc, out, reason))
    finally:
        for fh in (stdout, stderr):
            if fh is not None and not isinstance(fh, int):
                fh.close()
        _reap_group(proc)
    returncode = proc.returncode if proc.returncode is not None else -9
    result = _collect(spec, measurements, returncode, status_override, time.perf_counter() - start)
    if spec.quiet and result.status == "killed" and not result.data:
        tail = _tail(out / "stderr.txt")
        if tail:
            result.error = f"{result.error}; its stderr ends with:\n{tail}"
    note_other_cpu(result, other, proc.pid)  # its own session: start_new_session
    result = children_report.collect(spec, result, out)
    result.out_dir = None if temp and not spec.trace else out
    if temp and not spec.trace:
        shutil.rmtree(out, ignore_errors=True)
    return result


def _stop(proc: subprocess.Popen[bytes], out: Path, reason: str) -> None:
    """The watchdog's stack dump, SIGINT (the script sees KeyboardInterrupt and pitstop writes what it
    measured), then SIGKILL after the grace period (``grace_s``) or at a second Ctrl-C."""
    user = reason == "interrupted"
    with contextlib.suppress(KeyboardInterrupt):
        wait = INTERRUPT_STACKS_S if user else REQUEST_WAIT_S
        request_stacks(out, reason, wait_s=wait, alive=lambda: proc.poll() is None)
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGINT)
    wait_or_kill(proc, grace_s(reason))


def grace_s(reason: str) -> float:
    """How long a child stopped for ``reason`` gets to write what it measured before SIGKILL."""
    return INTERRUPT_GRACE_S if reason == "interrupted" else GRACE_S


def wait_or_kill(proc: subprocess.Popen[bytes], grace: float = GRACE_S) -> None:
    """Wait ``grace`` seconds for ``proc`` to end; then, or at a second Ctrl-C, SIGKILL its process group."""
    try:
        proc.wait(timeout=grace)
    except (subprocess.TimeoutExpired, KeyboardInterrupt):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def supervise(
    proc: subprocess.Popen[bytes],
    tick: Callable[[], str | None],
    timeout: float | None,
    stop: Callable[[str], None],
    poll_s: float = POLL_S,
) -> str | None:
    """Wait for ``proc``, calling ``tick`` every ``poll_s`` (progress; a status it returns stops the run);
    ``stop(status)`` ends it at ``timeout`` ("timeout"), at Ctrl-C or SIGTERM ("interrupted") or at the
    status ``tick`` gave. The status that stopped it, or None when it ended by itself."""
    deadline = None if timeout is None else time.monotonic() + timeout
    status: str | None = None
    watch = _ExitWatch(proc)
    # the child runs in its own session: SIGTERM to pitstop must stop it too (also while stopping it)
    with sigterm_interrupts():
        try:
            while True:
                if watch.ended(poll_s):
                    return None
                status = tick()
                if status is None and deadline is not None and time.monotonic() > deadline:
                    status = "timeout"
                if status is not None:
                    stop(status)
                    return status
        except KeyboardInterrupt:
            if status is None:  # a second Ctrl-C while stopping keeps the first status
                status = "interrupted"
                stop(status)
            return status
        finally:
            watch.close()


class _ExitWatch:
    """Waits for a process to end without polling, on a pidfd where there is one: ``Popen.wait(timeout)``
    sleeps and polls (about 40 wake-ups a second), and on a machine where the ranks have every core each
    wake-up of this parent is time taken from a rank."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        try:
            self.fd: int | None = os.pidfd_open(proc.pid)
        except (AttributeError, OSError):  # not Linux >= 5.3, or the process already reaped
            self.fd = None

    def ended(self, seconds: float) -> bool:
        """True once the process has ended, waiting up to ``seconds`` for it."""
        if self.fd is None:
            try:
                self.proc.wait(timeout=seconds)
            except subprocess.TimeoutExpired:
                return False
            return True
        select.select([self.fd], [], [], seconds)
        return self.proc.poll() is not None

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


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


def _collect(
    spec: RunSpec, path: Path, returncode: int, status_override: str | None, wall: float
) -> RunResult:
    try:
        data = steps_from_log(json.loads(path.read_text()), path.parent)
    except (OSError, ValueError, AttributeError):
        data = {}
    return collect_data(spec, data, returncode, status_override, wall, out_dir=path.parent)


def collect_data(
    spec: RunSpec,
    data: dict[str, Any],
    returncode: int,
    status_override: str | None,
    wall: float,
    out_dir: Path | None = None,
) -> RunResult:
    """A RunResult from a measurements record (the child's file, or an in-process Profiler's snapshot).
    ``out_dir``: the run folder, where the child's watchdog left its record (none in-process)."""
    status = data.get("status", "killed")
    error = data.get("error")
    if status in ("running", "probing") or not data:
        # the child never wrote its final record: killed, crashed hard, or hung past the grace period
        status = "killed"
        error = f"the script ended abruptly (exit status {returncode}, e.g. os._exit or a crash in native code); partial measurements shown"
        if returncode < 0:
            with contextlib.suppress(ValueError):
                error = (
                    f"the script was killed by {signal.Signals(-returncode).name}; partial measurements shown"
                )
        if not data:
            error = f"the script ended (exit status {returncode}) before pitstop could measure anything"
    if status_override == "timeout":
        status = "timeout"
        error = f"timed out after {spec.timeout:g} s; stopped the script" + (
            "" if data.get("status") not in (None, "running", "probing") else " (partial measurements)"
        )
    elif status_override == "interrupted":
        status, error = "interrupted", "interrupted (Ctrl-C or SIGTERM)"
    data["watchdog"] = read_watchdog(out_dir, status) if out_dir is not None else {}
    hung = hang_summary(data["watchdog"])
    error = f"{hung}; {error}" if hung and error else hung or error
    records = [StepRecord.from_dict(r) for r in data.get("steps", [])]
    warm = [r for r in records if r.warmup]
    measured = [r for r in records if not r.warmup]
    losses_all = data.get("losses") or []
    losses = [v for r, v in zip(records, losses_all, strict=False) if not r.warmup]
    if status in ("completed", "stopped") and not records and not spec.callback:
        error = "no optimizer step was seen, nor enough backward() calls to delimit steps by"
    if data.get("callback_error"):
        error = data["callback_error"] if error is None else f"{error}; {data['callback_error']}"
    config = {
        "loaders": data.get("loaders", []),
        "models": data.get("models", []),
        "optimizers": data.get("optimizers", []),
        "device": data.get("device"),
        "torch": data.get("torch", {}),
        "memory": data.get("memory", {}),
        "overrides": spec.overrides.to_dict(),
        "compile_error": data.get("compile_error"),
        "override_errors": data.get("override_errors") or [],
        "host_memory": data.get("host_memory"),
    }
    return RunResult(
        returncode=returncode,
        error=error,
        steps=measured,
        losses=[float("nan") if v is None else float(v) for v in losses],
        config=config,
        callback_result=data.get("callback_result"),
        wall_s=wall,
        status=status,
        warmup_steps=warm,
        data=data,
        command=list(spec.command),
        spec=spec,
        hang=data["watchdog"].get("hang"),
    )
