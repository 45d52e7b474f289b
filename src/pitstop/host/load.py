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


class CpuOutsideSession:
    """CPU time that processes outside one session used while a measurement ran, as a share of the
    machine's CPUs.

    A script started in a session of its own (``start_new_session``) keeps every process it makes in
    that session: DataLoader workers, torchrun's ranks, compile workers, even those orphaned when it
    exits, which ``OtherCpu``'s count of waited-for children would miss. So the processes outside it
    (and this one) are the other load: their CPU time at the end, less what each had at the start.
    A process that both started and ended in between is not seen: the share is a lower bound.
    """

    def __init__(self) -> None:
        self._t0 = time.monotonic()
        self._start = _cpu_by_process(None)

    def share(self, session: int) -> float:
        """Other processes' CPU time over the wall time times the machine's CPUs, the processes of
        ``session`` and this one left out."""
        wall = time.monotonic() - self._t0
        used = sum(max(0.0, cpu - self._start.get(key, 0.0)) for key, cpu in _cpu_by_process(session).items())
        cpus = psutil.cpu_count() or 1
        return used / (wall * cpus) if wall > 0 else 0.0


def _cpu_by_process(skip_session: int | None) -> dict[tuple[int, float], float]:
    """CPU seconds of each live process but this one (keyed by pid and start time: pids are reused),
    leaving out those in ``skip_session``."""
    out: dict[tuple[int, float], float] = {}
    me = os.getpid()
    for p in psutil.process_iter(["pid", "create_time", "cpu_times"]):
        info = p.info
        t = info.get("cpu_times")
        if info["pid"] == me or t is None:
            continue
        if skip_session is not None:
            try:
                if os.getsid(info["pid"]) == skip_session:
                    continue
            except OSError:  # exited since it was listed
                continue
        out[(info["pid"], info.get("create_time") or 0.0)] = t.user + t.system
    return out


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
