"""Safe reads of kernel interfaces (/proc/sys, /sys). Missing or unreadable files give None, never raise.

Every reader takes a ``root`` so tests can point it at a fake tree.
"""

from __future__ import annotations

import os
from pathlib import Path

PROC_SYS = "/proc/sys"


def read_text(path: str | os.PathLike[str]) -> str | None:
    try:
        return Path(path).read_text(errors="replace").strip()
    except OSError:
        return None


def read_int(path: str | os.PathLike[str]) -> int | None:
    text = read_text(path)
    try:
        return int(text.split()[0]) if text else None
    except ValueError:
        return None


def sysctl_path(name: str, root: str | os.PathLike[str] = PROC_SYS) -> Path:
    """``net.core.rmem_max`` -> /proc/sys/net/core/rmem_max."""
    return Path(root, *name.split("."))


def read_sysctl(name: str, root: str | os.PathLike[str] = PROC_SYS) -> str | None:
    """Current value of a kernel parameter as the kernel prints it (whitespace folded), or None."""
    text = read_text(sysctl_path(name, root))
    return " ".join(text.split()) if text is not None else None
