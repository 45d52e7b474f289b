"""How busy the machine was around a measurement: load average and other processes' CPU time.

Benchmark scripts record these so a result never claims a quiet or a busy machine it did not see.
"""

from __future__ import annotations

import os
import time

import psutil

from pitstop.host.cpu import usable_cores


def load_average() -> float | None:
    """The 1-minute load average, or None where the system does not report one."""
    try:
        return os.getloadavg()[0]
    except (OSError, AttributeError):
        return None


def load_line(start: float | None) -> str:
    """How busy the machine was around a measurement (``start`` from ``load_average()`` before it), for
    benchmark results: measured, so a result never claims a quiet or a busy machine it did not see."""

    def fmt(v: float | None) -> str:
        return "unknown" if v is None else f"{v:.2f}"

    return (
        f"load average (1 min) {fmt(start)} at start, {fmt(load_average())} at end, "
        f"on {usable_cores()} usable cores"
    )


class OtherCpu:
    """CPU time that processes outside this process tree used while a measurement ran.

    System-wide busy time (``psutil.cpu_times``) minus this process's and its children's, so a
    benchmark's own workers are not mistaken for competing work (a load average cannot tell them
    apart). Children count once they have been waited for, or while still alive at ``share()``.
    """

    def __init__(self) -> None:
        self._t0 = time.monotonic()
        self._busy0 = _busy_cpu_s()
        self._own0 = _own_cpu_s()

    def seconds(self) -> float:
        return max(0.0, (_busy_cpu_s() - self._busy0) - (_own_cpu_s() - self._own0))

    def share(self) -> float:
        """Other processes' CPU time over the wall time times the machine's CPUs (0 = had it alone)."""
        wall = time.monotonic() - self._t0
        cpus = psutil.cpu_count() or 1
        return self.seconds() / (wall * cpus) if wall > 0 else 0.0


def _busy_cpu_s() -> float:
    t = psutil.cpu_times()
    # guest time is already inside user time; steal is other VMs', not this machine's processes
    idle = ("idle", "iowait", "guest", "guest_nice", "steal")
    return sum(t) - sum(getattr(t, f, 0.0) for f in idle)


def _own_cpu_s() -> float:
    me = psutil.Process()
    t = me.cpu_times()
    total = t.user + t.system + t.children_user + t.children_system
    for child in me.children(recursive=True):
        try:
            c = child.cpu_times()
            total += c.user + c.system
        except psutil.Error:  # exited between listing and reading: counted once waited for
            pass
    return total
