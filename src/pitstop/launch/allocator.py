"""Find jemalloc or tcmalloc to LD_PRELOAD. Both return freed memory to the OS less eagerly and
fragment less than glibc malloc under the many-sized allocations of CPU training and inference.
Without either, ``glibc`` tunes glibc's own malloc through its environment variables to keep freed
blocks mapped (the settings of ``pitstop.recipes.host_memory``): most of the page-fault saving, nothing to install."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from pitstop.launch.binding import LaunchError
from pitstop.recipes.host_memory import GLIBC_ENV

# Library names in preference order (the unversioned .so is often only in -dev packages).
LIBS: dict[str, tuple[str, ...]] = {
    "jemalloc": ("libjemalloc.so.2", "libjemalloc.so"),
    "tcmalloc": ("libtcmalloc.so.4", "libtcmalloc_minimal.so.4", "libtcmalloc.so", "libtcmalloc_minimal.so"),
}
# jemalloc settings PyTorch's own CPU launcher (torch.backends.xeon.run_cpu) uses: keep freed pages
# around instead of giving them back to the kernel after every step.
JEMALLOC_CONF = (
    "oversize_threshold:1,background_thread:true,metadata_thp:auto,"
    "dirty_decay_ms:9000000000,muzzy_decay_ms:9000000000"
)
INSTALL_HINT = {
    "jemalloc": "apt install libjemalloc2 / dnf install jemalloc / conda install -c conda-forge jemalloc",
    "tcmalloc": "apt install libtcmalloc-minimal4 / dnf install gperftools-libs / conda install -c conda-forge gperftools",
}


@dataclass(frozen=True)
class Allocator:
    name: str
    path: str  # the library to preload; "" for glibc, which is tuned through ``env`` only
    env: dict[str, str] = field(default_factory=dict)


GLIBC = Allocator("glibc", "", dict(GLIBC_ENV))


def search_dirs() -> list[Path]:
    """Common install places beyond the linker cache: this Python's prefix (venv/conda) and system dirs."""
    dirs = [Path(sys.prefix, "lib"), Path(sys.base_prefix, "lib")]
    if conda := os.environ.get("CONDA_PREFIX"):
        dirs.append(Path(conda, "lib"))
    dirs += [
        Path.home() / ".local" / "lib",
        Path("/usr/local/lib"),
        Path("/usr/lib/x86_64-linux-gnu"),
        Path("/usr/lib/aarch64-linux-gnu"),
        Path("/usr/lib64"),
        Path("/usr/lib"),
    ]
    return dirs


def ldconfig_libs(text: str | None = None) -> dict[str, str]:
    """Library name -> path from ``ldconfig -p`` (or the given output). Empty when ldconfig is missing."""
    if text is None:
        try:
            text = subprocess.run(
                ["ldconfig", "-p"], capture_output=True, text=True, timeout=10, check=False
            ).stdout
        except (OSError, subprocess.SubprocessError):
            try:
                text = subprocess.run(
                    ["/sbin/ldconfig", "-p"], capture_output=True, text=True, timeout=10, check=False
                ).stdout
            except (OSError, subprocess.SubprocessError):
                return {}
    out: dict[str, str] = {}
    for line in text.splitlines():
        # "	libjemalloc.so.2 (libc6,x86-64) => /lib/x86_64-linux-gnu/libjemalloc.so.2"
        name, sep, path = line.strip().partition(" => ")
        if sep:
            out.setdefault(name.split(" ")[0], path.strip())
    return out


def find_allocator(
    name: str, ldconfig: dict[str, str] | None = None, dirs: list[Path] | None = None
) -> Allocator | None:
    """Locate ``jemalloc`` or ``tcmalloc``; None when not installed."""
    cache = ldconfig_libs() if ldconfig is None else ldconfig
    for lib in LIBS[name]:
        if lib in cache and Path(cache[lib]).exists():
            return _make(name, cache[lib])
    for d in search_dirs() if dirs is None else dirs:
        for lib in LIBS[name]:
            if (p := d / lib).exists():
                return _make(name, str(p))
    return None


def _make(name: str, path: str) -> Allocator:
    env = {"MALLOC_CONF": JEMALLOC_CONF} if name == "jemalloc" else {}
    return Allocator(name, path, env)


def resolve_allocator(
    choice: str, ldconfig: dict[str, str] | None = None, dirs: list[Path] | None = None
) -> tuple[Allocator | None, str | None]:
    """``--allocator`` -> (allocator or None, note). An explicit choice that is not installed raises
    LaunchError; ``auto`` takes jemalloc, then tcmalloc, then tuned glibc (with a note)."""
    if choice in ("none", "default"):
        return None, None
    if choice == "glibc":
        return GLIBC, None
    if choice == "auto":
        for name in LIBS:
            if a := find_allocator(name, ldconfig, dirs):
                return a, None
        return GLIBC, (
            "no jemalloc or tcmalloc found; glibc malloc keeps freed memory mapped instead "
            f"({', '.join(f'{k}={v}' for k, v in GLIBC_ENV.items())})"
        )
    if choice not in LIBS:
        raise LaunchError(f"unknown allocator {choice!r} (choose jemalloc, tcmalloc, glibc, auto or none)")
    if a := find_allocator(choice, ldconfig, dirs):
        return a, None
    raise LaunchError(
        f"--allocator {choice}: {' / '.join(LIBS[choice])} not found via ldconfig -p or in "
        f"{', '.join(str(d) for d in (search_dirs() if dirs is None else dirs))}. Install it ({INSTALL_HINT[choice]}) "
        "or use --allocator auto"
    )


def preload_env(alloc: Allocator, base: dict[str, str]) -> dict[str, str]:
    """Environment additions that preload ``alloc``, keeping anything already in LD_PRELOAD and the
    allocator's settings (MALLOC_CONF, MALLOC_*_) the user set."""
    env: dict[str, str] = {}
    if alloc.path:
        prev = base.get("LD_PRELOAD", "")
        parts = [alloc.path] + [p for p in prev.replace(" ", ":").split(":") if p and p != alloc.path]
        env["LD_PRELOAD"] = ":".join(parts)
    for k, v in alloc.env.items():
        if k not in base:
            env[k] = v
    return env
