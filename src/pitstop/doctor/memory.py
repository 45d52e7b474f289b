"""Memory probes: RAM (and a container's limit), swap, transparent huge pages, /dev/shm, locked memory."""

from __future__ import annotations

import os
import resource
from collections.abc import Callable
from pathlib import Path

from pitstop.findings import Finding, Severity
from pitstop.host.memory import thp_mode
from pitstop.host.sysfs import read_text
from pitstop.launch.sysctl import thp_check, verdict
from pitstop.units import GiB, MiB, gib

MIN_RAM = 16 * GiB  # seed advice: below this, datasets and pinned buffers crowd the page cache
MIN_SHM = 1 * GiB  # DataLoader workers pass batches through /dev/shm; docker's default is 64 MiB


def check_ram(meminfo: dict[str, int], cgroup_limit: int | None) -> list[Finding]:
    total, avail = meminfo.get("MemTotal"), meminfo.get("MemAvailable")
    if total is None:
        return [
            Finding("memory.ram", Severity.WARN, "RAM size unreadable", "/proc/meminfo has no MemTotal", {})
        ]
    effective = min(total, cgroup_limit) if cgroup_limit else total
    data = {"total_bytes": total, "available_bytes": avail, "cgroup_limit_bytes": cgroup_limit}
    ev = f"MemTotal {gib(total)}, MemAvailable {gib(avail)}" + (
        f", container memory limit {gib(cgroup_limit)}" if cgroup_limit else ""
    )
    out = []
    if effective < MIN_RAM:
        out.append(
            Finding(
                "memory.ram",
                Severity.WARN,
                f"{gib(effective)} of RAM usable: less than the 16 GiB a training box wants",
                ev,
                data,
                fix="Use fewer DataLoader workers and smaller prefetch, stream the dataset instead of loading it, "
                "or add RAM / raise the container limit.",
            )
        )
    else:
        out.append(Finding("memory.ram", Severity.PASS, f"{gib(effective)} of RAM", ev, data))
    if avail is not None:
        frac = avail / effective if effective else 0.0
        out.append(
            Finding(
                "memory.available",
                Severity.WARN if frac < 0.10 else Severity.PASS,
                f"Only {100 * frac:.0f}% of RAM available"
                if frac < 0.10
                else f"{100 * frac:.0f}% of RAM available",
                f"MemAvailable {gib(avail)} of {gib(effective)}",
                {"available_fraction": round(frac, 3)},
                fix="Other processes hold the memory: stop them before training, or expect swapping / OOM kills."
                if frac < 0.10
                else "",
            )
        )
    return out


def check_swap(meminfo: dict[str, int], swaps: str | None) -> list[Finding]:
    total, free = meminfo.get("SwapTotal", 0), meminfo.get("SwapFree", 0)
    ram = meminfo.get("MemTotal", 0)
    used = total - free
    devices = [ln.split()[0] for ln in (swaps or "").splitlines()[1:] if ln.strip()]
    ratio = total / ram if ram else None
    data = {
        "total_bytes": total,
        "used_bytes": used,
        "ram_bytes": ram,
        "swap_to_ram": None if ratio is None else round(ratio, 2),
        "devices": devices,
    }
    ev = (
        f"SwapTotal {gib(total)} ({ratio:.2f}x RAM), in use {gib(used)}, RAM {gib(ram)}; "
        if ratio is not None
        else f"SwapTotal {gib(total)}, in use {gib(used)}, RAM unknown; "
    ) + f"devices: {', '.join(devices) or 'none'}"
    tradeoff = (
        "Trade-off: swap (1-2x RAM is the usual advice) lets a memory spike slow the run instead of an OOM kill, "
        "but a training loop that swaps steadily is many times slower - size batches and workers to fit in RAM."
    )
    if used > 0.25 * max(total, 1) and used > GiB:
        return [
            Finding(
                "memory.swap",
                Severity.WARN,
                f"{gib(used)} of swap in use: something is being paged out",
                ev,
                data,
                fix="Free RAM (fewer workers, smaller prefetch, no in-RAM dataset copies) so training never swaps. "
                + tradeoff,
            )
        ]
    if total == 0:
        return [
            Finding(
                "memory.swap",
                Severity.INFO,
                "No swap: a memory spike kills the process",
                ev,
                data,
                fix=tradeoff,
            )
        ]
    return [Finding("memory.swap", Severity.PASS, f"{gib(total)} swap, barely used", ev, data, fix=tradeoff)]


def check_thp(sys_root: str | os.PathLike[str] = "/sys") -> list[Finding]:
    mode = thp_mode(sys_root)
    text = read_text(Path(sys_root, "kernel", "mm", "transparent_hugepage", "enabled"))
    data = {"mode": mode}
    if mode is None:
        return [
            Finding(
                "memory.thp", Severity.INFO, "Transparent huge pages: unknown", "THP setting unreadable", data
            )
        ]
    ev = f"/sys/kernel/mm/transparent_hugepage/enabled: {text}"
    if mode == "never":
        return [
            Finding(
                "memory.thp",
                verdict(thp_check(sys_root)),  # `pitstop sysctl`'s verdict on the same setting
                "Transparent huge pages off",
                ev,
                data,
                fix="'madvise' lets torch ask for huge pages for large CPU tensors (THP_MEM_ALLOC_ENABLE=1), "
                "cutting TLB misses; needs root.",
                fix_code="echo madvise | sudo tee /sys/kernel/mm/transparent_hugepage/enabled",
            )
        ]
    return [
        Finding(
            "memory.thp",
            Severity.PASS,
            f"Transparent huge pages: {mode}",
            ev,
            data,
            fix="With 'madvise', set THP_MEM_ALLOC_ENABLE=1 to let torch's CPU allocator use them."
            if mode == "madvise"
            else "",
        )
    ]


def check_shm(
    shm: str | os.PathLike[str] = "/dev/shm", statvfs: Callable[[str], os.statvfs_result] = os.statvfs
) -> list[Finding]:
    try:
        st = statvfs(str(shm))
    except OSError as e:
        return [
            Finding(
                "memory.shm",
                Severity.WARN,
                f"{shm} missing: DataLoader workers cannot share batches",
                f"statvfs({shm}): {e.strerror}",
                {"path": str(shm)},
                fix="Mount a tmpfs on /dev/shm (containers: --shm-size=8g or --ipc=host).",
            )
        ]
    size, free = st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize
    data = {"path": str(shm), "size_bytes": size, "free_bytes": free}
    ev = f"{shm}: size {gib(size)}, free {gib(free)}"
    if size < MIN_SHM:
        return [
            Finding(
                "memory.shm",
                Severity.WARN,
                f"{shm} only {size / MiB:.0f} MiB: DataLoader workers will crash with 'bus error'",
                ev,
                data,
                fix="Give the container more shared memory (docker's default is 64 MiB).",
                fix_code="docker run --shm-size=8g ...   # or --ipc=host",
            )
        ]
    return [Finding("memory.shm", Severity.PASS, f"{shm}: {gib(size)}", ev, data)]


def check_memlock(
    limits: tuple[int, int] | None = None, sys_root: str | os.PathLike[str] = "/sys"
) -> list[Finding]:
    """Locked-memory limit: RDMA (InfiniBand/RoCE NCCL) registers pinned buffers against it."""
    soft, hard = limits if limits is not None else resource.getrlimit(resource.RLIMIT_MEMLOCK)
    rdma = Path(sys_root, "class", "infiniband").is_dir() and any(
        Path(sys_root, "class", "infiniband").iterdir()
    )

    def fmt(v: int) -> str:
        return "unlimited" if v == resource.RLIM_INFINITY else f"{v / MiB:.0f} MiB"

    data = {
        "soft": None if soft == resource.RLIM_INFINITY else soft,
        "hard": None if hard == resource.RLIM_INFINITY else hard,
        "rdma": rdma,
    }
    ev = f"ulimit -l: soft {fmt(soft)}, hard {fmt(hard)}; RDMA devices: {'yes' if rdma else 'none'}"
    if soft == resource.RLIM_INFINITY:
        return [Finding("memory.memlock", Severity.PASS, "Locked memory unlimited", ev, data)]
    return [
        Finding(
            "memory.memlock",
            Severity.WARN if rdma else Severity.INFO,
            f"Locked memory limited to {fmt(soft)}" + (" with RDMA devices present" if rdma else ""),
            ev,
            data,
            fix="CUDA pinned host memory (pin_memory=True) is pinned by the driver and not capped by this, but "
            "RDMA/InfiniBand NCCL and mlock-based pinning are: raise it for multi-node jobs.",
            fix_code="ulimit -l unlimited   # or memlock in /etc/security/limits.conf; docker: --ulimit memlock=-1",
        )
    ]
