"""Sampling for `pitstop monitor`: CPU, RAM, disk, network (psutil), GPUs (pitstop.host.nvml), a followed
process tree; the low-GPU-utilization rule; the CSV log. No printing here (see monitor_view, monitor_cli).
"""

from __future__ import annotations

import contextlib
import csv
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

import psutil

from pitstop.findings import Finding, Severity
from pitstop.host.nvml import GpuSample, Nvml, NvmlUnavailable
from pitstop.units import GiB

MB = 1e6


@dataclass
class Sample:
    """One reading. Rates are averages since the previous sample; ``t`` is seconds since monitoring began."""

    t: float
    cpu_pct: float
    cpu_per_core: list[float]
    ram_used_bytes: int
    ram_total_bytes: int
    swap_used_bytes: int
    disk_read_mb_s: float | None
    disk_write_mb_s: float | None
    net_recv_mb_s: float | None
    net_sent_mb_s: float | None
    proc_alive: bool | None = None  # followed command: None when not following one
    proc_cpu_pct: float | None = None  # its whole process tree, 100 = one core
    proc_rss_bytes: int | None = None
    proc_read_mb_s: float | None = None  # its storage I/O (iotop's view; a child that exits between
    proc_write_mb_s: float | None = None  # samples takes its last interval's I/O with it)
    gpus: list[GpuSample] = field(default_factory=list)


def _rate(new: float | None, old: float | None, dt: float) -> float | None:
    if new is None or old is None or dt <= 0:
        return None
    return max(0.0, (new - old) / MB / dt)


class Sampler:
    """Reads counters each call and turns cumulative ones into rates since the previous call.

    Construction takes the first reading, so the first ``sample()`` already has rates.
    """

    def __init__(
        self,
        nvml: Nvml | None = None,
        follow_pid: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.nvml = nvml
        self.follow_pid = follow_pid
        self.clock = clock
        self.nvml_error: str | None = None
        self._procs: dict[int, psutil.Process] = {}
        self._io: dict[int, tuple[int, int]] = {}  # pid -> (read_bytes, write_bytes) at the last sample
        self.t0 = clock()
        self._last_t = self.t0
        self._disk = self._disk_counters()
        self._net = self._net_counters()
        psutil.cpu_percent(percpu=True)  # prime: the next call reports usage since now
        for p in self._proc_tree():  # I/O baseline of the followed processes
            with contextlib.suppress(psutil.Error, AttributeError):
                c = p.io_counters()
                self._io[p.pid] = (c.read_bytes, c.write_bytes)

    @staticmethod
    def _disk_counters() -> tuple[float, float] | None:
        try:
            d = psutil.disk_io_counters()
        except (OSError, RuntimeError):
            return None
        return None if d is None else (float(d.read_bytes), float(d.write_bytes))

    @staticmethod
    def _net_counters() -> tuple[float, float] | None:
        try:
            n = psutil.net_io_counters()
        except (OSError, RuntimeError):
            return None
        return None if n is None else (float(n.bytes_recv), float(n.bytes_sent))

    def _proc_tree(self) -> list[psutil.Process]:
        """The followed process and its descendants, reusing Process objects so cpu_percent has a baseline."""
        if self.follow_pid is None:
            return []
        try:
            root = self._procs.get(self.follow_pid) or psutil.Process(self.follow_pid)
            tree = [root, *root.children(recursive=True)]
        except psutil.Error:
            return []
        live = {}
        for p in tree:
            live[p.pid] = self._procs.get(p.pid, p)
            if p.pid not in self._procs:
                with contextlib.suppress(psutil.Error):
                    live[p.pid].cpu_percent(None)  # baseline
        self._procs = live
        return list(live.values())

    def sample(self) -> Sample:
        now = self.clock()
        dt = now - self._last_t
        self._last_t = now
        per_core = [float(x) for x in psutil.cpu_percent(percpu=True)]
        vm, sw = psutil.virtual_memory(), psutil.swap_memory()
        disk, net = self._disk_counters(), self._net_counters()
        s = Sample(
            t=now - self.t0,
            cpu_pct=sum(per_core) / len(per_core) if per_core else 0.0,
            cpu_per_core=per_core,
            ram_used_bytes=int(vm.total - vm.available),
            ram_total_bytes=int(vm.total),
            swap_used_bytes=int(sw.used),
            disk_read_mb_s=_rate(disk and disk[0], self._disk and self._disk[0], dt),
            disk_write_mb_s=_rate(disk and disk[1], self._disk and self._disk[1], dt),
            net_recv_mb_s=_rate(net and net[0], self._net and self._net[0], dt),
            net_sent_mb_s=_rate(net and net[1], self._net and self._net[1], dt),
        )
        self._disk, self._net = disk, net
        if self.follow_pid is not None:
            cpu, rss, alive, rd, wr = 0.0, 0, False, 0, 0
            io: dict[int, tuple[int, int]] = {}
            for p in self._proc_tree():
                try:
                    with p.oneshot():
                        cpu += p.cpu_percent(None)
                        rss += p.memory_info().rss
                        alive = alive or (p.pid == self.follow_pid and p.status() != psutil.STATUS_ZOMBIE)
                        c = p.io_counters()
                except (psutil.Error, AttributeError):
                    continue
                io[p.pid] = (c.read_bytes, c.write_bytes)
                # a process new since the last sample did all its I/O in this interval
                r0, w0 = self._io.get(p.pid, (0, 0))
                rd, wr = rd + max(0, c.read_bytes - r0), wr + max(0, c.write_bytes - w0)
            self._io = io
            s.proc_alive, s.proc_cpu_pct, s.proc_rss_bytes = alive, cpu, rss
            if dt > 0:
                s.proc_read_mb_s, s.proc_write_mb_s = rd / MB / dt, wr / MB / dt
        if self.nvml is not None and self.nvml_error is None:
            try:
                s.gpus = self.nvml.samples()
            except NvmlUnavailable as e:  # a GPU fell off the bus, the driver went away: keep the rest
                self.nvml_error = e.reason
        return s


def open_nvml(lib: Any | None = None) -> tuple[Nvml | None, str | None]:
    """An entered Nvml (caller exits it), or (None, why not)."""
    nv = Nvml(lib)
    try:
        nv.__enter__()
        if nv.device_count() == 0:
            nv.__exit__(None, None, None)
            return None, "NVML reports no GPUs"
    except NvmlUnavailable as e:
        nv.__exit__(None, None, None)
        return None, e.reason
    return nv, None


# ------------------------------------------------------------------ the rule
@dataclass
class Streak:
    gpu: int
    start: float
    end: float
    utils: list[float]
    pids: set[int]

    @property
    def seconds(self) -> float:
        return self.end - self.start


# Processes that hold a GPU on desktops and are not training (graphics clients NVML also lists).
NOT_TRAINING = frozenset({"Xorg", "X", "Xwayland", "gnome-shell", "kwin_x11", "kwin_wayland", "plasmashell"})


def is_training_pid(pid: int) -> bool:
    """A GPU process counts as training unless it is a known display server. A pid we cannot see (a
    container sees the host's pids from NVML) counts: on servers GPU users are jobs."""
    try:
        return psutil.Process(pid).name() not in NOT_TRAINING
    except psutil.Error:
        return True


class LowUtilRule:
    """GPU utilization under ``threshold`` % for at least ``window_s`` seconds while a training process runs
    (the followed command, or a non-graphics process NVML lists on that GPU): the GPU waits for its input."""

    def __init__(
        self,
        threshold: float = 70.0,
        window_s: float = 30.0,
        is_training: Callable[[int], bool] = is_training_pid,
    ) -> None:
        self.threshold = threshold
        self.window_s = window_s
        self.is_training = is_training
        self._open: dict[int, Streak] = {}
        self.worst: dict[int, Streak] = {}
        self.training_seen: set[int] = set()

    def update(self, s: Sample) -> None:
        for g in s.gpus:
            training = bool(s.proc_alive) or any(self.is_training(p) for p in g.processes or [])
            if training:
                self.training_seen.add(g.index)
            low = training and g.util_gpu_pct is not None and g.util_gpu_pct < self.threshold
            cur = self._open.get(g.index)
            if low:
                assert g.util_gpu_pct is not None
                if cur is None:
                    cur = self._open[g.index] = Streak(g.index, s.t, s.t, [], set())
                cur.end = s.t
                cur.utils.append(g.util_gpu_pct)
                cur.pids.update(g.processes or [])
                self._keep(cur)
            elif cur is not None:
                del self._open[g.index]

    def _keep(self, st: Streak) -> None:
        best = self.worst.get(st.gpu)
        if best is None or best is st or st.seconds > best.seconds:
            self.worst[st.gpu] = st

    def active(self) -> list[Streak]:
        """Streaks going on now that are already long enough to flag."""
        return [st for st in self._open.values() if st.seconds >= self.window_s]

    def findings(self, command: Sequence[str] | None = None) -> list[Finding]:
        out = []
        for gpu, st in sorted(self.worst.items()):
            if st.seconds < self.window_s:
                continue
            mean = sum(st.utils) / len(st.utils)
            who = f"; GPU processes {sorted(st.pids)}" if st.pids else ""
            cmd = " ".join(command) if command else "python train.py ARGS"
            out.append(
                Finding(
                    id="monitor.gpu_low_util",
                    severity=Severity.WARN,
                    title=f"GPU {gpu} under {self.threshold:.0f}% busy for {st.seconds:.0f} s while training ran",
                    evidence=(
                        f"GPU {gpu} utilization mean {mean:.0f}% (min {min(st.utils):.0f}%, max {max(st.utils):.0f}%) "
                        f"over {len(st.utils)} samples from t={st.start:.0f} s to t={st.end:.0f} s{who}"
                    ),
                    data={
                        "gpu": gpu,
                        "seconds": st.seconds,
                        "mean_util_pct": mean,
                        "samples": len(st.utils),
                        "start_s": st.start,
                        "threshold_pct": self.threshold,
                    },
                    fix=(
                        "the GPU is waiting for work: the input pipeline (DataLoader workers, decoding, "
                        "host-to-device copies) or host-side syncs are the likely bottleneck; profile a run "
                        "to see where the step time goes"
                    ),
                    fix_code=f"pitstop profile -- {cmd}",
                    est_saving_s=None,
                )
            )
        return out


# ------------------------------------------------------------------ CSV
def csv_header(s: Sample) -> list[str]:
    cols = ["time_s", "cpu_pct", *(f"cpu{i}_pct" for i in range(len(s.cpu_per_core)))]
    cols += ["ram_used_gib", "ram_total_gib", "swap_used_gib", "disk_read_mb_s", "disk_write_mb_s"]
    cols += [
        "net_recv_mb_s",
        "net_sent_mb_s",
        "proc_cpu_pct",
        "proc_rss_gib",
        "proc_read_mb_s",
        "proc_write_mb_s",
    ]
    for g in s.gpus:
        i = g.index
        cols += [f"gpu{i}_util_pct", f"gpu{i}_mem_util_pct", f"gpu{i}_mem_used_gib", f"gpu{i}_power_w"]
        cols += [f"gpu{i}_temp_c", f"gpu{i}_sm_clock_mhz", f"gpu{i}_mem_clock_mhz", f"gpu{i}_procs"]
    return cols


def csv_row(s: Sample, header: Sequence[str]) -> list[str]:
    v: dict[str, Any] = {
        "time_s": s.t,
        "cpu_pct": s.cpu_pct,
        "ram_used_gib": s.ram_used_bytes / GiB,
        "ram_total_gib": s.ram_total_bytes / GiB,
        "swap_used_gib": s.swap_used_bytes / GiB,
        "disk_read_mb_s": s.disk_read_mb_s,
        "disk_write_mb_s": s.disk_write_mb_s,
        "net_recv_mb_s": s.net_recv_mb_s,
        "net_sent_mb_s": s.net_sent_mb_s,
        "proc_cpu_pct": s.proc_cpu_pct,
        "proc_rss_gib": None if s.proc_rss_bytes is None else s.proc_rss_bytes / GiB,
        "proc_read_mb_s": s.proc_read_mb_s,
        "proc_write_mb_s": s.proc_write_mb_s,
    }
    v.update({f"cpu{i}_pct": x for i, x in enumerate(s.cpu_per_core)})
    for g in s.gpus:
        i = g.index
        v.update(
            {
                f"gpu{i}_util_pct": g.util_gpu_pct,
                f"gpu{i}_mem_util_pct": g.util_mem_pct,
                f"gpu{i}_mem_used_gib": None if g.mem_used_bytes is None else g.mem_used_bytes / GiB,
                f"gpu{i}_power_w": g.power_w,
                f"gpu{i}_temp_c": g.temperature_c,
                f"gpu{i}_sm_clock_mhz": g.sm_clock_mhz,
                f"gpu{i}_mem_clock_mhz": g.mem_clock_mhz,
                f"gpu{i}_procs": None if g.processes is None else len(g.processes),
            }
        )
    return [
        "" if (x := v.get(c)) is None else (f"{x:.4f}" if isinstance(x, float) else str(x)) for c in header
    ]


class CsvLog:
    """Writes one row per sample and flushes it, so an interrupted run keeps everything measured."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = path
        self._fh: IO[str] = open(path, "w", newline="")  # noqa: SIM115
        self._w = csv.writer(self._fh)
        self._header: list[str] | None = None

    def write(self, s: Sample) -> None:
        if self._header is None:
            self._header = csv_header(s)
            self._w.writerow(self._header)
        self._w.writerow(csv_row(s, self._header))
        self._fh.flush()

    def close(self) -> None:
        self._fh.close()


# ------------------------------------------------------------------ summary
class RunSummary:
    """Mean and max of each measured series, kept as running totals so a week-long monitor stays small."""

    def __init__(self) -> None:
        self.samples = 0
        self.seconds = 0.0
        self._acc: dict[str, list[float]] = {}  # name -> [sum, count, max]

    def _add(self, name: str, v: float | None) -> None:
        if v is None:
            return
        a = self._acc.setdefault(name, [0.0, 0.0, v])
        a[0] += v
        a[1] += 1
        a[2] = max(a[2], v)

    def update(self, s: Sample) -> None:
        self.samples += 1
        self.seconds = s.t
        self._add("cpu_pct", s.cpu_pct)
        self._add("ram_used_gib", s.ram_used_bytes / GiB)
        self._add("disk_read_mb_s", s.disk_read_mb_s)
        self._add("disk_write_mb_s", s.disk_write_mb_s)
        self._add("net_recv_mb_s", s.net_recv_mb_s)
        self._add("net_sent_mb_s", s.net_sent_mb_s)
        self._add("proc_cpu_pct", s.proc_cpu_pct)
        self._add("proc_read_mb_s", s.proc_read_mb_s)
        self._add("proc_write_mb_s", s.proc_write_mb_s)
        for g in s.gpus:
            self._add(f"gpu{g.index}_util_pct", g.util_gpu_pct)
            self._add(
                f"gpu{g.index}_mem_used_gib", None if g.mem_used_bytes is None else g.mem_used_bytes / GiB
            )
            self._add(f"gpu{g.index}_power_w", g.power_w)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"samples": self.samples, "seconds": self.seconds}
        for k, (total, n, mx) in self._acc.items():
            out[k] = {"mean": total / n, "max": mx}
        return out
