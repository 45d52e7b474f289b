"""Keep freed host memory inside the process so CPU training steps stop page-faulting their tensors in.

glibc malloc serves large allocations (above ``M_MMAP_THRESHOLD``: 128 KiB at start, adapting upwards
only as blocks are freed) with a fresh ``mmap`` and gives them back with ``munmap``, and it trims the
heap top above ``M_TRIM_THRESHOLD``. A training step allocates the same activation and gradient tensors
every step, so on CPU each step then takes a page fault (and a page of zeroing) for every 4 KiB it
touches: thousands per step for a small conv net. Raising both thresholds makes freed blocks stay
mapped and be reused by the next step. jemalloc/tcmalloc (``pitstop launch --allocator``) get the same
effect by preloading; this does it for glibc from inside the process, without a restart
(``pitstop launch --allocator glibc`` sets the same through the environment of a new process).

Cost: the process keeps its high-water mark of heap memory (as the CUDA caching allocator does).
Nothing is changed where the user chose already: a preloaded jemalloc/tcmalloc/mimalloc, or glibc's
own ``MALLOC_*_`` / ``GLIBC_TUNABLES`` malloc settings.

One component (``pitstop.recipes.component``, ``SURFACE`` ``HOST``). Which command calls which part:

- ``pitstop.train`` (``TrainConfig.keep_host_memory``, ``prepare_model``) and profile's injection
  (``Overrides.keep_host_memory``, ``pitstop.profile.capture.hooks``): ``keep_host_memory``; ``kept``
  (what the script or an override did, in the run's facts);
- profile's exit probe (``pitstop.profile.probe.probes``, stored under ``PROBE``): ``preloaded_allocator``,
  ``kept``, ``blocker``, ``minor_page_faults``, then ``keep_host_memory``; profile's rules
  (``rules_compute.host_memory_rules``) and fresh runs (``fresh_confirm``, ``malloc_confirm``) and
  ``pitstop launch --allocator glibc``: ``GLIBC_ENV``;
- ``fix --apply`` (``pitstop.fix.apply.apply_keep_host_memory``): ``EDIT_LINE`` and ``EDIT_IMPORT``
  first in the script's main;
- a finding's code: ``SNIPPET``.
"""

from __future__ import annotations

import ctypes
import os
import resource
import sys
from dataclasses import dataclass
from pathlib import Path

from pitstop.recipes.component import HOST

NAME = "host_memory"
KNOB = "keep_host_memory"  # the ``Knobs`` field (and ``TrainConfig``'s, with "auto": on for CPU)
SURFACE = HOST
FINDING = "host.page_faults"
PROBE = "host_memory"  # its probe result's key
SNIPPET = "from pitstop.train import keep_host_memory\nkeep_host_memory()  # once, before the training loop"
EDIT_LINE = "keep_host_memory()"
EDIT_IMPORT = "from pitstop.train import keep_host_memory"

# mallopt parameter numbers from glibc's <malloc.h>.
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
# Largest blocks kept out of mmap: 1 GiB where glibc accepts it (2.35+), else its documented 64-bit
# ceiling of 32 MiB. The trim threshold is mallopt's int maximum.
MMAP_THRESHOLDS = (1 << 30, 32 << 20)
TRIM_THRESHOLD = 2**31 - 1
_OTHER_ALLOCATORS = ("libjemalloc", "libtcmalloc", "libmimalloc")
# The same settings for a child process, through glibc's environment variables (read at start-up).
# 32 MiB: the largest mmap threshold every 64-bit glibc accepts there.
GLIBC_ENV = {
    "MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLDS[-1]),
    "MALLOC_TRIM_THRESHOLD_": str(TRIM_THRESHOLD),
}
_USER_ENV = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_")


@dataclass(frozen=True)
class HostMemory:
    """What ``keep_host_memory`` did: ``applied`` and, either way, a one-line reason."""

    applied: bool
    detail: str
    mmap_threshold: int | None = None

    def __str__(self) -> str:
        return self.detail


_done: HostMemory | None = None


def _preloaded_allocator(maps: str) -> str | None:
    for line in maps.splitlines():
        path = line.rsplit(" ", 1)[-1]
        for lib in _OTHER_ALLOCATORS:
            if Path(path).name.startswith(lib):
                return lib[3:]
    return None


def _user_setting(env: dict[str, str]) -> str | None:
    for key in _USER_ENV:
        if key in env:
            return key
    if "glibc.malloc." in env.get("GLIBC_TUNABLES", ""):
        return "GLIBC_TUNABLES"
    return None


def _glibc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version.restype = ctypes.c_char_p
        libc.gnu_get_libc_version()
        libc.mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
        return libc
    except (OSError, AttributeError):  # musl, macOS, or a libc without mallopt
        return None


def keep_host_memory(
    *,
    libc: ctypes.CDLL | None = None,
    env: dict[str, str] | None = None,
    maps: str | None = None,
    platform: str | None = None,
) -> HostMemory:
    """Raise glibc's mmap and trim thresholds for this process, once; say what was done or why not.

    The keyword arguments replace the process's own libc, environment, /proc/self/maps text and
    ``sys.platform`` (for tests). Calling it again returns the first result without touching malloc.
    """
    global _done
    real = libc is None and env is None and maps is None and platform is None
    if real and _done is not None:
        return _done
    result = _decide(libc, env, maps, platform)
    if real:
        _done = result
    return result


def kept() -> HostMemory | None:
    """What ``keep_host_memory()`` did in this process, or None when it has not been called."""
    return _done


def minor_page_faults() -> int:
    """Minor page faults of this process so far (all threads): each is a fresh page mapped and zeroed."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def preloaded_allocator(maps: str | None = None) -> str | None:
    """jemalloc/tcmalloc/mimalloc when one is loaded into this process (``maps``: /proc/self/maps text)."""
    if maps is None:
        try:
            maps = Path("/proc/self/maps").read_text()
        except OSError:
            maps = ""
    return _preloaded_allocator(maps)


def blocker(
    env: dict[str, str] | None = None, maps: str | None = None, platform: str | None = None
) -> str | None:
    """Why malloc should be left as it is here (a reason starting with "off:"), or None to go ahead."""
    if (platform or sys.platform) != "linux":
        return "off: glibc malloc tuning is Linux-only"
    if other := preloaded_allocator(maps):
        return f"off: {other} is preloaded and already keeps freed memory"
    if key := _user_setting(dict(os.environ) if env is None else env):
        return f"off: malloc already configured by {key}"
    return None


def _decide(
    libc: ctypes.CDLL | None, env: dict[str, str] | None, maps: str | None, platform: str | None
) -> HostMemory:
    if reason := blocker(env, maps, platform):
        return HostMemory(False, reason)
    lib = libc if libc is not None else _glibc()
    if lib is None:
        return HostMemory(False, "off: the C library is not glibc")
    for threshold in MMAP_THRESHOLDS:
        if lib.mallopt(M_MMAP_THRESHOLD, threshold) == 1:
            break
    else:
        return HostMemory(False, "off: glibc refused mallopt(M_MMAP_THRESHOLD)")
    if lib.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) != 1:
        return HostMemory(
            False, "partly: mmap threshold raised, glibc refused mallopt(M_TRIM_THRESHOLD)", threshold
        )
    return HostMemory(
        True, f"glibc keeps freed blocks up to {threshold >> 20} MiB mapped (mallopt)", threshold
    )
