"""Facts about this machine's compute that several parts need (doctor, profile rules, train's `auto`).

Read-only and cheap; every function degrades to a safe answer when a file or driver is missing.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import psutil

# CPU flags that make bf16 matmuls fast (oneDNN uses them): AVX512_BF16 (Cooper Lake, Zen 4+), AMX (Sapphire Rapids+).
FAST_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def cpu_flags(cpuinfo: str | os.PathLike[str] = "/proc/cpuinfo") -> frozenset[str]:
    try:
        text = Path(cpuinfo).read_text(errors="replace")
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith(("flags", "Features")):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


@functools.cache
def _host_flags() -> frozenset[str]:
    return cpu_flags()


def cpu_has_fast_bf16(flags: frozenset[str] | None = None) -> bool:
    flags = _host_flags() if flags is None else flags
    return any(f in flags for f in FAST_BF16_FLAGS)


def usable_cores() -> int:
    """Cores this process may run on (affinity and cgroup quota aware), not the machine's total."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = psutil.cpu_count(logical=True) or 1
    quota = cgroup_cpu_quota()
    return max(1, min(n, int(quota)) if quota else n)


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


def gpu_has_tensor_cores(capability: tuple[int, int]) -> bool:
    """Volta (7.0) and later have tensor cores for fp16; Ampere (8.0) and later also for bf16/tf32."""
    return capability >= (7, 0)


def gpu_supports_bf16(capability: tuple[int, int]) -> bool:
    return capability >= (8, 0)


def preferred_amp_dtype(device_type: str, flags: frozenset[str] | None = None) -> str | None:
    """'bfloat16', 'float16' or None (stay fp32) for this hardware. Import torch only when asked about CUDA."""
    if device_type == "cpu":
        return "bfloat16" if cpu_has_fast_bf16(flags) else None
    if device_type == "cuda":
        import torch

        if not torch.cuda.is_available():
            return None
        cap = torch.cuda.get_device_capability()
        if gpu_supports_bf16(cap):
            return "bfloat16"
        return "float16" if gpu_has_tensor_cores(cap) else None
    return None
