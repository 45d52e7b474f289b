"""`pitstop monitor`: sample every interval, show it live, log CSV, follow a command, report at the end."""

from __future__ import annotations

import argparse
import contextlib
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import IO, Any

from rich.console import Console
from rich.live import Live

from pitstop.cliutil import finish, usage_error
from pitstop.findings import Finding, Report, Severity
from pitstop.launch.monitor import CsvLog, LowUtilRule, RunSummary, Sampler, open_nvml
from pitstop.launch.monitor_view import render


class _Output:
    """Reads the followed command's merged output: keeps the last lines for the screen, tees to a log,
    and echoes it when there is no live screen."""

    def __init__(self, stream: IO[bytes], log: IO[bytes] | None, echo: IO[bytes] | None, keep: int = 8):
        self.tail: deque[str] = deque(maxlen=keep)
        self._t = threading.Thread(target=self._pump, args=(stream, log, echo), daemon=True)
        self._t.start()

    def _pump(self, stream: IO[bytes], log: IO[bytes] | None, echo: IO[bytes] | None) -> None:
        for line in iter(stream.readline, b""):
            if log:
                log.write(line)
                log.flush()
            if echo:
                echo.write(line)
                echo.flush()
            self.tail.append(line.decode(errors="replace").rstrip("\n")[-200:])

    def join(self) -> None:
        self._t.join(timeout=5)


def _stop(child: subprocess.Popen[bytes], signalled: bool) -> None:
    """Stop the followed command: after a terminal Ctrl-C it got SIGINT already, so first let it finish
    on its own (it may be saving a checkpoint); then SIGINT, then terminate, then kill."""
    if signalled and _waited(child, 10.0):
        return
    for send, wait in ((lambda: child.send_signal(signal.SIGINT), 30.0), (child.terminate, 10.0)):
        if child.poll() is not None:
            return
        with contextlib.suppress(OSError):
            send()
        if _waited(child, wait):
            return
    child.kill()
    child.wait()


def _waited(child: subprocess.Popen[bytes], timeout: float) -> bool:
    try:
        child.wait(timeout=timeout)
        return True
    except subprocess.TimeoutExpired:
        return False


@dataclass
class _Session:
    """What a monitor run holds open: the CSV log, the command's output log, NVML, the followed command
    and the reader of its output."""

    use_live: bool
    json_stdout: bool
    csvlog: CsvLog | None = None
    log_fh: IO[bytes] | None = None
    nv: Any = None
    gpu_note: str | None = None
    child: subprocess.Popen[bytes] | None = None
    output: _Output | None = None

    def close(self, interrupted: bool) -> None:
        """Stop the followed command (see ``_stop``), then close what is open."""
        if self.child is not None:
            _stop(self.child, signalled=interrupted)
        if self.output:
            self.output.join()
        if self.csvlog:
            self.csvlog.close()
        if self.log_fh:
            self.log_fh.close()
        if self.nv:
            self.nv.__exit__(None, None, None)


def run_monitor(
    args: argparse.Namespace, command: Sequence[str], nvml_lib: Any | None = None, live: bool | None = None
) -> int:
    """The command; ``nvml_lib`` (a fake pynvml) and ``live`` are for tests."""
    if args.plot:
        return _plot(args)
    if args.interval <= 0:
        return usage_error("--interval must be positive")
    if args.duration is not None and args.duration <= 0:
        return usage_error("--duration must be positive")
    session = _open(args, command, nvml_lib, live)
    if isinstance(session, str):
        return usage_error(session)
    child = session.child
    sampler = Sampler(session.nv, child.pid if child else None)
    rule = LowUtilRule(args.low_util, args.window)
    summary = RunSummary()
    interrupted = False
    try:
        _sample(args, command, session, sampler, rule, summary)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        session.close(interrupted)
    report = Report(
        tool="monitor",
        meta={
            "interval_s": args.interval,
            "command": " ".join(command) or None,
            "csv": args.csv,
            "interrupted": interrupted,
        },
        sections={"summary": summary.to_dict()},
    )
    report.add(*_findings(rule, summary, command, session.gpu_note, sampler.nvml_error, child, args))
    code = finish(report, args)
    if interrupted:
        return code
    if child is not None:
        rc = child.returncode
        return 128 - rc if rc < 0 else rc
    return code


def _plot(args: argparse.Namespace) -> int:
    """``--plot``: draw a CSV log written by an earlier run; nothing is sampled."""
    from pitstop.launch.monitor_plot import PlotError, plot_csv
    from pitstop.plotting import unavailable

    if missing := unavailable("--plot"):
        return usage_error(missing)
    try:
        out = plot_csv(args.plot, args.out)
    except PlotError as e:
        return usage_error(str(e))
    Console(stderr=True).print(f"plot: {out}")
    return 0


def _open(
    args: argparse.Namespace, command: Sequence[str], nvml_lib: Any | None, live: bool | None
) -> _Session | str:
    """Open the logs and NVML and start the followed command (its output piped when there is a live
    screen or a command log); the usage error's message if a log cannot be written or the command
    cannot start (then nothing is left open)."""
    json_stdout = getattr(args, "json", None) == "-"
    use_live = (
        live if live is not None else not (args.no_live or args.quiet or json_stdout) and sys.stdout.isatty()
    )
    session = _Session(use_live, json_stdout)
    if args.csv:
        try:
            session.csvlog = CsvLog(args.csv)
        except OSError as e:
            return f"cannot write {args.csv}: {e}"
    if args.command_log:
        try:
            session.log_fh = open(args.command_log, "wb")  # noqa: SIM115
        except OSError as e:
            return f"cannot write {args.command_log}: {e}"
    session.nv, session.gpu_note = open_nvml(nvml_lib)
    if command:
        pipe = use_live or session.log_fh is not None
        try:
            session.child = subprocess.Popen(
                list(command),
                stdout=subprocess.PIPE if pipe else (sys.stderr if json_stdout else None),
                stderr=subprocess.STDOUT if pipe else None,
            )
        except OSError as e:
            session.close(interrupted=False)
            return f"cannot start {command[0]!r}: {e}"
        if pipe:
            assert session.child.stdout is not None
            echo = None if use_live else (sys.stderr.buffer if json_stdout else sys.stdout.buffer)
            session.output = _Output(session.child.stdout, session.log_fh, echo)
    return session


def _sample(
    args: argparse.Namespace,
    command: Sequence[str],
    session: _Session,
    sampler: Sampler,
    rule: LowUtilRule,
    summary: RunSummary,
) -> None:
    """Sample every ``--interval`` into the summary, the rule and the CSV log, redrawing the live screen,
    until the followed command exits or ``--duration`` is reached."""
    title = f"pitstop monitor — every {args.interval:g} s" + (
        f" — following: {' '.join(command)}" if command else ""
    )
    child, output = session.child, session.output
    live_cm = (
        Live(console=Console(), auto_refresh=False, transient=False)
        if session.use_live
        else contextlib.nullcontext()
    )
    deadline = time.monotonic()
    with live_cm as lv:
        while True:
            # next sample one interval on; if sampling fell behind, do not try to catch up
            deadline = max(deadline + args.interval, time.monotonic())
            remaining = deadline - time.monotonic()
            if child is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    child.wait(timeout=max(0.0, remaining))
            elif remaining > 0:
                time.sleep(remaining)  # pacing between samples
            s = sampler.sample()
            summary.update(s)
            rule.update(s)
            if session.csvlog:
                session.csvlog.write(s)
            if lv is not None:
                tail = list(output.tail) if output else []
                lv.update(
                    render(s, title, rule.active(), args.low_util, session.gpu_note, tail), refresh=True
                )
            if child is not None and child.poll() is not None:
                break
            if args.duration is not None and s.t >= args.duration:
                break


def _findings(
    rule: LowUtilRule,
    summary: RunSummary,
    command: Sequence[str],
    gpu_note: str | None,
    nvml_error: str | None,
    child: subprocess.Popen[bytes] | None,
    args: argparse.Namespace,
) -> list[Finding]:
    out = rule.findings(command)
    if gpu_note:
        out.append(Finding("monitor.gpu", Severity.INFO, "no GPU readings", f"NVML: {gpu_note}"))
    elif nvml_error:
        out.append(
            Finding("monitor.gpu", Severity.WARN, "GPU readings stopped", f"NVML error mid-run: {nvml_error}")
        )
    elif not out:
        if rule.training_seen:
            gpus = sorted(rule.training_seen)
            out.append(
                Finding(
                    "monitor.gpu_low_util",
                    Severity.PASS,
                    f"GPU utilization never under {args.low_util:.0f}% for {args.window:.0f} s while training ran",
                    f"GPUs {gpus}, {summary.samples} samples every {args.interval:g} s",
                )
            )
        else:
            out.append(
                Finding(
                    "monitor.gpu_low_util",
                    Severity.INFO,
                    "no training process seen on a GPU",
                    "the low-utilization rule needs a followed command or a process on the GPU",
                )
            )
    d = summary.to_dict()
    cpu = d.get("cpu_pct")
    parts = [f"{summary.samples} samples over {summary.seconds:.1f} s"]
    if cpu:
        parts.append(f"CPU mean {cpu['mean']:.0f}% (max {cpu['max']:.0f}%)")
    for k, label in (("disk_read_mb_s", "disk read"), ("disk_write_mb_s", "disk write")):
        if st := d.get(k):
            parts.append(f"{label} mean {st['mean']:.1f} MB/s (max {st['max']:.1f})")
    if child is not None:
        parts.append(f"command exited with {child.returncode}")
    out.append(Finding("monitor.run", Severity.INFO, "what was measured", "; ".join(parts), data=d))
    return out
