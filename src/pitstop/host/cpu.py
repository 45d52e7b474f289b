"""Facts about this machine's CPUs: model, feature flags, and the cores this process may use.

Read-only and cheap; every function degrades to a safe answer when a file is missing.
"""

from __future__ import annotations

import functools
import os
import platform
from pathlib import Path

import psutil

CPUINFO = "/proc/cpuinfo"
# CPU flags that make bf16 matmuls fast (oneDNN uses them): AVX512_BF16 (Cooper Lake, Zen 4+), AMX (Sapphire Rapids+).
FAST_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def cpuinfo_field(names: tuple[str, ...], cpuinfo: str | os.PathLike[str] = CPUINFO) -> str | None:
    """The value of the first /proc/cpuinfo line whose key starts with one of ``names``, or None."""
    try:
        text = Path(cpuinfo).read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(names):
            return line.split(":", 1)[1].strip() if ":" in line else ""
    return None


def cpu_flags(cpuinfo: str | os.PathLike[str] = CPUINFO) -> frozenset[str]:
    # x86 says "flags", arm64 says "Features"
    return frozenset((cpuinfo_field(("flags", "Features"), cpuinfo) or "").split())


def cpu_model(cpuinfo: str | os.PathLike[str] = CPUINFO) -> str:
    return cpuinfo_field(("model name",), cpuinfo) or platform.processor() or platform.machine()


@functools.cache
def _host_flags() -> frozenset[str]:
    return cpu_flags()


def cpu_has_fast_bf16(flags: frozenset[str] | None = None) -> bool:
    flags = _host_flags() if flags is None else flags
    return any(f in flags for f in FAST_BF16_FLAGS)


def affinity_cpus() -> int:
    """CPUs in this process's affinity mask (all logical CPUs where the OS has no affinity call)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return psutil.cpu_count(logical=True) or 1


def cores_allowed(affinity: int, quota: float | None) -> int:
    """Cores a process may keep busy: its affinity, capped by a cgroup CPU quota when there is one."""
    return max(1, min(affinity, int(quota)) if quota else affinity)


def usable_cores() -> int:
    """Cores this process may run on (affinity and cgroup quota aware), not the machine's total."""
    return cores_allowed(affinity_cpus(), cgroup_cpu_quota())


def cgroup_cpu_quota(root: str | os.PathLike[str] = "/sys/fs/cgroup") -> float | None:
    """CPUs allowed by a cgroup v2 (cpu.max) or v1 (cfs_quota/period) limit, or None when unlimited."""
    base = Path(root)
    try:
        text = (base / "cpu.max").read_text().split()
        if text and text[0] != "max":
            return int(text[0]) / int(text[1])
        return None
    except (OSError, ValueError, IndexError):
        pass
    try:
        quota = int((base / "cpu" / "cpu.cfs_quota_us").read_text())
        period = int((base / "cpu" / "cpu.cfs_period_us").read_text())
        return quota / period if quota > 0 and period > 0 else None
    except (OSError, ValueError):
        return None
