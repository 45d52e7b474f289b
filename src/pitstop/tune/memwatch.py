"""Watch RAM and /dev/shm while a measurement runs, so a setting that would exhaust them is stopped.

DataLoader workers each hold a copy-on-write image of the parent plus what they allocate, and every
batch in flight sits in /dev/shm until the main process takes it. Too many workers or too deep a
prefetch queue can fill either; the tuner must stop such a setting with a reason, not take the machine
down. A background thread samples psutil and shutil.disk_usage; the measuring loop polls ``tripped``.
"""

from __future__ import annotations

import shutil
import threading
from dataclasses import dataclass

import psutil

from pitstop.units import MiB

SHM_PATH = "/dev/shm"


@dataclass
class MemLimits:
    """Floors below which a measurement is aborted. None reads the live value (tests pass fakes)."""

    min_available_ram: int = 512 * MiB
    min_free_shm: int = 64 * MiB
    ram_available: int | None = None  # override of psutil's available RAM, for tests and budgets
    shm_free: int | None = None  # override of /dev/shm free space


def ram_available(limits: MemLimits | None = None) -> int:
    if limits and limits.ram_available is not None:
        return limits.ram_available
    return int(psutil.virtual_memory().available)


def shm_free(limits: MemLimits | None = None) -> int | None:
    if limits and limits.shm_free is not None:
        return limits.shm_free
    try:
        return int(shutil.disk_usage(SHM_PATH).free)
    except OSError:
        return None


def shm_used() -> int | None:
    try:
        return int(shutil.disk_usage(SHM_PATH).used)
    except OSError:
        return None


def tree_rss(proc: psutil.Process | None = None) -> tuple[int, int, int]:
    """(main RSS, summed RSS of live child processes, number of children)."""
    proc = proc or psutil.Process()
    main = proc.memory_info().rss
    kids, n = 0, 0
    for child in proc.children(recursive=True):
        try:
            kids += child.memory_info().rss
            n += 1
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return main, kids, n


def children_uss() -> list[int]:
    """Unique memory of each child (what a worker really costs; RSS double-counts shared pages)."""
    out = []
    for child in psutil.Process().children(recursive=True):
        try:
            out.append(int(child.memory_full_info().uss))
        except (psutil.NoSuchProcess, psutil.AccessDenied, AttributeError):
            continue
    return out


class MemWatch:
    """Context manager: samples memory every ``interval`` s; records peaks; trips when a floor is crossed.

    Peaks are growth over the values at entry, so the numbers say what this measurement cost.
    """

    def __init__(self, limits: MemLimits | None = None, interval: float = 0.02) -> None:
        self.limits = limits or MemLimits()
        self.interval = interval
        self.peak_rss = 0
        self.peak_shm_growth = 0
        self.reason: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._shm0 = 0
        self._ram0 = 0

    @property
    def tripped(self) -> bool:
        return self.reason is not None

    def sample(self) -> None:
        main, kids, _ = tree_rss()
        self.peak_rss = max(self.peak_rss, main + kids)
        used = shm_used()
        if used is not None:
            self.peak_shm_growth = max(self.peak_shm_growth, used - self._shm0)
        lim = self.limits
        if lim.ram_available is not None:
            # A fake budget: what this measurement grew must stay inside it.
            avail = lim.ram_available - max(0, main + kids - self._ram0)
        else:
            avail = ram_available()
        if avail < lim.min_available_ram and self.reason is None:
            self.reason = (
                f"available RAM fell to {avail / MiB:.0f} MiB (floor {lim.min_available_ram / MiB:.0f} MiB); "
                f"pitstop + workers RSS {(main + kids) / MiB:.0f} MiB"
            )
        free = shm_free(lim)
        if lim.shm_free is not None and used is not None:
            free = lim.shm_free - max(0, used - self._shm0)
        if free is not None and free < lim.min_free_shm and self.reason is None:
            self.reason = (
                f"/dev/shm free space fell to {free / MiB:.0f} MiB (floor {lim.min_free_shm / MiB:.0f} MiB)"
            )

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.sample()
            except (psutil.Error, OSError):
                continue

    def __enter__(self) -> MemWatch:
        main, kids, _ = tree_rss()
        self._ram0 = main + kids
        self._shm0 = shm_used() or 0
        self.sample()
        self._thread = threading.Thread(target=self._run, name="pitstop-memwatch", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1.0)
