"""What one event costs on this machine, measured in isolation: the bound a finding that prices events
(seconds per page fault times the faults a step took) may not exceed.

A probe's difference divided by the events it removed is a price only when nothing else changed between
its two passes; under load, or with warm-up in between, it is not (a fault priced at 150 us on a machine
where one costs 2 us). ``page_fault_s`` measures one minor fault directly: fresh anonymous pages written
once (each write maps and zeroes a page) against the same pages written again (no fault), the least of a
few repeats so another process's burst does not count. Bounded (8 MiB written ten times, about 0.1 s)
and cached per process.
"""

from __future__ import annotations

import functools
import mmap
import resource
import time

FAULT_BYTES = 8 * 2**20  # 2048 pages of 4 KiB: enough faults that the timer's resolution does not matter
FAULT_REPEATS = 5
# A fault in a training step may cost more than one in isolation (page-table lock contention between
# threads, cache misses after the kernel zeroed the page): findings are bounded at this multiple of it.
FAULT_COST_MULTIPLE = 5.0


def _minor_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _fault_in(data: bytes) -> tuple[float, float, int]:
    """Seconds to write ``data`` into fresh anonymous pages, seconds to write it again, faults taken."""
    m = mmap.mmap(-1, len(data))
    try:
        f0 = _minor_faults()
        t0 = time.perf_counter()
        m[:] = data  # every page is touched for the first time: mapped and zeroed by the kernel
        t1 = time.perf_counter()
        faults = _minor_faults() - f0
        m[:] = data  # the same copy, the pages already mapped
        t2 = time.perf_counter()
    finally:
        m.close()
    return t1 - t0, t2 - t1, faults


@functools.cache
def page_fault_s() -> float | None:
    """Seconds one minor page fault costs this process, measured on fresh anonymous pages (None where
    the writes took no faults to time, e.g. a kernel that pre-faults anonymous memory)."""
    data = b"\x01" * FAULT_BYTES
    runs = [_fault_in(data) for _ in range(FAULT_REPEATS)]
    faults = min(r[2] for r in runs)
    if faults < FAULT_BYTES // mmap.PAGESIZE // 2:
        return None  # huge pages or pre-faulting: too few faults to price one
    # least first write minus least rewrite: each the run another process disturbed least
    return max(0.0, min(r[0] for r in runs) - min(r[1] for r in runs)) / faults


def page_fault_bound_s(isolated_s: float | None) -> float | None:
    """The most one fault may be charged in a finding: ``FAULT_COST_MULTIPLE`` x its isolated cost."""
    return None if not isolated_s else FAULT_COST_MULTIPLE * isolated_s
