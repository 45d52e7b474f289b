"""How busy the machine was around a measurement: load average, other processes' CPU time, steal and
the run queue on the CPUs a process may use (``CompetitionMeter``), and the thread count that fits.

Benchmark scripts record these so a result never claims a quiet or a busy machine it did not see;
profile's thread probe and doctor's thread check size threads by the cores other work leaves free.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

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
        self._steal0 = _steal_s()

    def share(self, session: int) -> float:
        """Other processes' CPU time over the wall time times the machine's CPUs, the processes of
        ``session`` and this one left out."""
        wall = time.monotonic() - self._t0
        used = sum(max(0.0, cpu - self._start.get(key, 0.0)) for key, cpu in _cpu_by_process(session).items())
        cpus = psutil.cpu_count() or 1
        return used / (wall * cpus) if wall > 0 else 0.0

    def steal_share(self) -> float:
        """Time the hypervisor gave the machine's CPUs to other guests, over the wall time times the
        CPUs (0 on bare metal, or where the kernel does not report steal)."""
        wall = time.monotonic() - self._t0
        cpus = psutil.cpu_count() or 1
        return max(0.0, _steal_s() - self._steal0) / (wall * cpus) if wall > 0 else 0.0


def _steal_s() -> float:
    return getattr(psutil.cpu_times(), "steal", 0.0)


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


# ------------------------------------------------------------------------------------------ competition

PROC_STAT = "/proc/stat"
TASKS = "/proc/self/task"


@dataclass(frozen=True)
class CpuTicks:
    """One read of /proc/stat: busy and steal seconds per logical CPU, and the runnable tasks now."""

    busy_s: dict[int, float]
    steal_s: dict[int, float]
    procs_running: int | None


def read_proc_stat(path: str | os.PathLike[str] = PROC_STAT) -> CpuTicks | None:
    """Per-CPU busy time (all but idle, iowait, steal and guest, which user time holds already) and
    steal time in seconds, and ``procs_running``; None where the file is unreadable (not Linux)."""
    try:
        text = Path(path).read_text()
    except OSError:
        return None
    try:
        hz = float(os.sysconf("SC_CLK_TCK"))
    except (ValueError, OSError, AttributeError):
        hz = 100.0
    busy: dict[int, float] = {}
    steal: dict[int, float] = {}
    running = None
    for line in text.splitlines():
        parts = line.split()
        if len(parts) > 4 and parts[0].startswith("cpu") and parts[0][3:].isdigit():
            v = [int(x) for x in parts[1:11]] + [0] * (10 - len(parts[1:11]))
            # user nice system idle iowait irq softirq steal guest guest_nice
            busy[int(parts[0][3:])] = (sum(v[:3]) + v[5] + v[6]) / hz
            steal[int(parts[0][3:])] = v[7] / hz
        elif len(parts) == 2 and parts[0] == "procs_running":
            running = int(parts[1])
    return CpuTicks(busy, steal, running)


def own_runnable_threads(tasks: str | os.PathLike[str] = TASKS) -> int:
    """This process's threads that are running or waiting for a CPU now (state R)."""
    n = 0
    try:
        entries = list(os.scandir(tasks))
    except OSError:
        return 1  # at least the thread asking
    for d in entries:
        try:
            stat = Path(d.path, "stat").read_text()
        except OSError:  # the thread ended since the listing
            continue
        end = stat.rfind(")")  # the state follows the command name, which may hold spaces
        n += stat[end + 2 : end + 3] == "R"
    return n


def own_wait_s(tasks: str | os.PathLike[str] = TASKS) -> float | None:
    """Seconds this process's live threads have spent runnable but waiting for a CPU (schedstat's run
    delay); None where the kernel does not report it."""
    total, seen = 0.0, False
    try:
        entries = list(os.scandir(tasks))
    except OSError:
        return None
    for d in entries:
        try:
            fields = Path(d.path, "schedstat").read_text().split()
            total += int(fields[1]) / 1e9
            seen = True
        except (OSError, IndexError, ValueError):
            continue
    return total if seen else None


@dataclass(frozen=True)
class Competition:
    """What a process competed with for the CPUs it may use, over a measured window.

    other_busy_cores: CPU time of everything but this process (and its children) on its CPUs, over the
        window: the cores other work kept busy (what it got, while this process also wanted them).
    steal_cores: time the hypervisor gave those CPUs to other guests, in cores.
    other_runnable: mean count of other tasks runnable (running or queued) at the samples, scaled to this
        process's share of the machine's CPUs: what other work wanted; None where not sampled.
    own_waiting: this process's threads' time waiting for a CPU, per second of the window (the
        threads it kept queued, on average); None where the kernel does not report it.
    """

    seconds: float
    usable_cores: int
    cpus: int
    other_busy_cores: float
    steal_cores: float
    other_runnable: float | None = None
    own_waiting: float | None = None
    load_average: float | None = None

    @property
    def taken_cores(self) -> float:
        """Cores other work and the hypervisor take from this process: what others wanted (runnable) or
        got (busy), whichever is more, plus steal."""
        return max(self.other_busy_cores, self.other_runnable or 0.0) + self.steal_cores

    @property
    def free_cores(self) -> float:
        return max(0.0, self.usable_cores - self.taken_cores)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "taken_cores": self.taken_cores, "free_cores": self.free_cores}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Competition:
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})

    def text(self) -> str:
        """'other processes kept 1.0 of 2 usable cores busy (1.3 other runnable tasks on them), steal
        0.0 cores, load average 3.10, over 0.5 s'."""
        queue = (
            f" ({self.other_runnable:.1f} other runnable tasks on them)"
            if self.other_runnable is not None
            else ""
        )
        wait = (
            f"; this process's threads waited {self.own_waiting:.2f} s for a CPU per second"
            if self.own_waiting and self.own_waiting >= 0.005
            else ""
        )
        load = f", load average {self.load_average:.2f}" if self.load_average is not None else ""
        return (
            f"other processes kept {self.other_busy_cores:.1f} of {self.usable_cores} usable cores busy{queue}, "
            f"steal {self.steal_cores:.1f} cores{load}, over {self.seconds:.1f} s{wait}"
        )


class CompetitionMeter:
    """Measures, from its creation on, what this process competes with on the CPUs of its affinity.

    ``sample()`` adds a run-queue reading (call it where this process's own threads are not all
    busy, e.g. between timed passes); ``result()`` gives the ``Competition`` so far. Where /proc/stat
    cannot be read, other work's busy time is the machine's (``OtherCpu``), scaled to these CPUs.
    """

    def __init__(self) -> None:
        try:
            self.cpu_ids = set(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            self.cpu_ids = set(range(psutil.cpu_count() or 1))
        self._t0 = time.monotonic()
        self._stat0 = read_proc_stat()
        self._fallback = OtherCpu() if self._stat0 is None else None
        self._own0 = _own_cpu_s()
        self._wait0 = own_wait_s()
        self._load = load_average()
        self._runnable: list[float] = []

    def sample(self) -> None:
        st = read_proc_stat()
        if st is None or st.procs_running is None:
            return
        others = max(0, st.procs_running - own_runnable_threads())
        self._runnable.append(others * len(self.cpu_ids) / max(1, len(st.busy_s) or 1))

    def result(self) -> Competition:
        wall = max(1e-9, time.monotonic() - self._t0)
        st = read_proc_stat()
        n = len(self.cpu_ids)
        if self._stat0 is not None and st is not None:
            mine = self.cpu_ids & set(st.busy_s) & set(self._stat0.busy_s)
            busy = sum(st.busy_s[c] - self._stat0.busy_s[c] for c in mine)
            steal = sum(st.steal_s[c] - self._stat0.steal_s[c] for c in mine)
            other = max(0.0, busy - (_own_cpu_s() - self._own0)) / wall
        else:
            cpus = psutil.cpu_count() or 1
            other = (self._fallback.seconds() / wall) * n / cpus if self._fallback else 0.0
            steal = 0.0
        wait1 = own_wait_s()
        waiting = (wait1 - self._wait0) / wall if wait1 is not None and self._wait0 is not None else None
        return Competition(
            seconds=round(wall, 3),
            usable_cores=usable_cores(),
            cpus=n,
            other_busy_cores=round(other, 3),
            steal_cores=round(max(0.0, steal) / wall, 3),
            other_runnable=round(statistics.fmean(self._runnable), 3) if self._runnable else None,
            own_waiting=round(max(0.0, waiting), 3) if waiting is not None else None,
            load_average=self._load,
        )


def measure_competition(seconds: float = 0.5, samples: int = 10) -> Competition:
    """What this process would compete with: ``seconds`` of watching the CPUs while it sleeps, with
    ``samples`` run-queue readings."""
    meter = CompetitionMeter()
    for _ in range(samples):
        time.sleep(seconds / samples)
        meter.sample()
    return meter.result()


def fitting_threads(free_cores: float, processes: int = 1) -> int:
    """Intra-op threads per process that fit ``free_cores`` shared by ``processes`` busy processes (at
    least 1): a thread per free core, half a core rounding up."""
    return max(1, math.floor(free_cores / max(1, processes) + 0.5))
