"""What one event costs on this machine, measured in isolation: the bound a finding that prices events
(seconds per page fault times the faults a step took) may not exceed.

A probe's difference divided by the events it removed is a price only when nothing else changed between
its two passes; under load, or with warm-up in between, it is not (a fault priced at 150 us on a machine
where one costs 2 us). ``page_fault_s`` measures one minor fault directly: fresh anonymous pages mapped,
written once (each write faults: the kernel maps and zeroes a page) and unmapped, against pages already
mapped written again. Both in this thread's CPU time (user and kernel), which time spent waiting for a
CPU does not inflate, and the least of a few repeats, so other processes' load does not count.
Bounded (8 MiB written fifteen times, about 0.1 s on a quiet core) and cached per process.
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
    """Seconds to map fresh anonymous pages, write ``data`` into them and unmap them (what glibc's
    malloc and free do for a large block), seconds to write it into pages already mapped, and the
    faults the first took."""
    f0 = _minor_faults()
    t0 = time.thread_time()
    m = mmap.mmap(-1, len(data))
    m[:] = data  # every page is touched for the first time: mapped and zeroed by the kernel
    m.close()
    fresh = time.thread_time() - t0
    faults = _minor_faults() - f0
    m = mmap.mmap(-1, len(data))
    try:
        m[:] = data
        t0 = time.thread_time()
        m[:] = data  # the same copy, the pages already mapped
        mapped = time.thread_time() - t0
    finally:
        m.close()
    return fresh, mapped, faults


@functools.cache
def page_fault_s() -> float | None:
    """Seconds one minor page fault costs this process, its page's map and unmap included, measured on
    fresh anonymous pages (None where the writes took too few faults to time: huge pages, a kernel
    that pre-faults anonymous memory)."""
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
