"""Memory facts: /proc/meminfo, a container's memory limit, the transparent-huge-page mode.

Every reader takes a path or root so tests can point it at a fake tree; missing files give empty answers.
"""

from __future__ import annotations

import os
from pathlib import Path

from pitstop.host.sysfs import read_text


def read_meminfo(path: str | os.PathLike[str] = "/proc/meminfo") -> dict[str, int]:
    """/proc/meminfo in bytes: {'MemTotal': ..., 'MemAvailable': ..., 'SwapTotal': ...}."""
    out: dict[str, int] = {}
    for line in (read_text(path) or "").splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            out[key.strip()] = int(parts[0]) * (1024 if parts[1:2] == ["kB"] else 1)
    return out


def cgroup_memory_limit(root: str | os.PathLike[str] = "/sys/fs/cgroup") -> int | None:
    """A container's memory limit (cgroup v2 memory.max or v1 limit_in_bytes), None when unlimited."""
    for rel in ("memory.max", "memory/memory.limit_in_bytes"):
        text = read_text(Path(root, rel))
        if text and text != "max" and text.isdigit():
            v = int(text)
            return v if v < 2**60 else None  # v1 says "unlimited" with a huge number
    return None


def thp_mode(sys_root: str | os.PathLike[str] = "/sys") -> str | None:
    """Selected transparent-huge-page mode (``always [madvise] never`` -> ``madvise``), or None if unreadable."""
    text = read_text(Path(sys_root, "kernel", "mm", "transparent_hugepage", "enabled"))
    if not text or "[" not in text:
        return None
    return text.split("[", 1)[1].split("]", 1)[0]
