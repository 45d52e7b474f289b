"""Waiting for a child process and its process group: progress while it runs, and the stop at a timeout,
at Ctrl-C or SIGTERM, or when the caller says so (``supervise``); SIGKILL after a grace period for a child
that does not stop (``wait_or_kill``). ``runner`` (one script) and ``ranks`` (a launcher and its ranks) both
wait here.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import time
from collections.abc import Callable

from pitstop.interrupts import sigterm_interrupts

GRACE_S = 20.0  # after SIGINT at a timeout: time for the child to write what it measured
# Ctrl-C / SIGTERM: the user waits, so the child gets less (pitstop stops within 2 s in all); a child that
# has not written its final record by then is killed, and its last periodic record is what was measured
INTERRUPT_GRACE_S = 1.0
POLL_S = 0.25


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
