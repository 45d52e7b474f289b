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
  (``rules_compute.host_memory_rules``): ``rules`` on the probe's result, with profile's thresholds as a
  ``HostJudge``; fresh runs (``fresh_confirm``, ``malloc_confirm``) and ``pitstop launch --allocator
  glibc``: ``GLIBC_ENV``;
- ``fix --apply`` (``pitstop.fix.apply.apply_keep_host_memory``): ``EDIT_LINE`` and ``EDIT_IMPORT``
  first in the script's main;
- a finding's code: ``SNIPPET``.
"""

from __future__ import annotations

import ctypes
import os
import resource
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pitstop.findings import Finding, Severity
from pitstop.host.event_costs import FAULT_COST_MULTIPLE, page_fault_bound_s
from pitstop.recipes.component import HOST, HostJudge
from pitstop.recipes.entries import entry
from pitstop.units import duration as ms

NAME = "host_memory"
KNOB = "keep_host_memory"  # the ``Knobs`` field (and ``TrainConfig``'s, with "auto": on for CPU)
SURFACE = HOST
FINDING = "host.page_faults"
PROBE = "host_memory"  # its probe result's key
SNIPPET = "from pitstop.train import keep_host_memory\nkeep_host_memory()  # once, before the training loop"
EDIT_LINE = "keep_host_memory()"
EDIT_IMPORT = "from pitstop.train import keep_host_memory"

# its registry entry: name, snippet, finding, knob and probe are the constants above
RECIPE = entry(
    __name__,
    title="keep freed host memory",
    train="TrainConfig.keep_host_memory",
    apply="pitstop.fix.apply.apply_keep_host_memory",
    untimed=True,
)

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


# ------------------------------------------------------------------------------------------- rule

_FIX = (
    "Keep freed memory in the process, once at start: pitstop.train.keep_host_memory() (raises glibc's "
    "mmap/trim thresholds); or, without a code change, start the script with `pitstop launch --allocator "
    "glibc` (the same through glibc's environment variables) or `--allocator jemalloc`. Cost: the "
    "process keeps its peak heap."
)


def rules(bd: Any, hm: Mapping[str, Any] | None, judge: HostJudge) -> list[Finding]:
    """Profile's finding on CPU steps that page-fault their tensors in (glibc gives large freed blocks
    back to the kernel), from the probe's result (``hm``: the one stored under ``PROBE``; ``bd``: the
    run's ``Breakdown``): a pass where malloc keeps freed memory already, the faults' cost where the
    probe timed them, else info where the run took enough faults to be worth a ``pitstop fix`` run."""
    if not hm:
        return []
    data = {**hm, "faults_per_step": bd.faults_per_step}
    if hm.get("kept"):  # the script kept freed memory itself, or jemalloc/tcmalloc is preloaded
        return [
            Finding(
                id=FINDING,
                severity=Severity.PASS,
                title="Freed host memory stays mapped: steps do not page-fault their tensors in",
                evidence=f"{hm['skipped']}; {bd.faults_per_step:,.0f} minor page faults per step in the run "
                "(mean)",
                data=data,
            )
        ]
    if "saving_s" not in hm:
        return []
    measured = (
        f"{bd.faults_per_step:,.0f} minor page faults per step in the run (mean); a training step on the "
        f"script's last batch: {ms(hm['base_s'])} and {hm['base_faults']:,.0f} faults with malloc as it "
        f"was, {ms(hm['new_s'])} and {hm['new_faults']:,.0f} faults with freed memory kept mapped "
        "(medians, one after the other: the change cannot be undone in the process)"
    )
    env = " ".join(f"{k}={v}" for k, v in GLIBC_ENV.items())
    fix_code = f"{SNIPPET}\n# or: pitstop launch --allocator glibc -- train.py   (= {env} python train.py)"
    # The probe runs after the script, with the heap in another state, so its own fault count is not the
    # run's: what carries over is the time one fault costs, applied to the faults the run's steps took.
    dropped = hm["base_faults"] - hm["new_faults"]
    timed = dropped >= judge.MIN_FAULTS_TO_TIME  # else the probe's heap took too few faults to time one
    per_fault = hm["saving_s"] / dropped if timed and judge.probe_helps(dict(hm)) else 0.0  # below noise
    per_fault, unexplained = _bounded_per_fault(per_fault, hm.get("isolated_fault_s"), dropped)
    saving, share = judge.cost(bd, per_fault * bd.faults_per_step)
    if timed and share >= judge.MIN_SHARE:
        data.update(per_fault_s=per_fault, est_saving_s=saving)
        return [
            Finding(
                id=FINDING,
                severity=judge.sev(share),
                title="CPU steps page-fault their tensors in: malloc returns freed memory to the kernel",
                evidence=f"{measured}{unexplained}; {per_fault * 1e6:.2f} us per fault x "
                f"{bd.faults_per_step:,.0f} faults per step = {ms(saving)} per step",
                data=data,
                fix=_FIX,
                fix_code=fix_code,
                est_saving_s=saving,
                share=share,
            )
        ]
    if not timed and bd.faults_per_step >= judge.FAULTS_WORTH_A_RUN:
        # The run's faults are known but not their cost.
        return [
            Finding(
                id=FINDING,
                severity=Severity.INFO,
                title=f"CPU steps page-fault {bd.faults_per_step:,.0f} pages each; the probe could not time it",
                evidence=measured + f". `pitstop fix --candidates {NAME}` times it on the whole script",
                data=data,
                fix=_FIX,
                fix_code=fix_code,
            )
        ]
    return [
        Finding(
            id=FINDING,
            severity=Severity.PASS,
            title="Page faults measured to cost under 1% of the step here"
            if timed
            else f"Steps take few page faults ({bd.faults_per_step:,.0f} per step)",
            evidence=measured,
            data=data,
        )
    ]


def _bounded_per_fault(per_fault: float, isolated: float | None, dropped: float) -> tuple[float, str]:
    """The probe's price of one fault, at most ``FAULT_COST_MULTIPLE`` x what one costs on this machine
    in isolation (``pitstop.host.event_costs``), and the evidence's words when that bound applied."""
    bound = page_fault_bound_s(isolated)
    if bound is None or per_fault <= bound:
        return per_fault, ""
    rest = (per_fault - bound) * dropped
    return bound, (
        f"; the probe's difference is {per_fault * 1e6:.1f} us per fault, but one fault costs "
        f"{(isolated or 0.0) * 1e6:.2f} us on this machine in isolation: faults are charged at most "
        f"{FAULT_COST_MULTIPLE:g}x that, and the rest of the probe's difference ({ms(rest)}) is not "
        "explained by faults (the probe's two passes differed in more than malloc, or were disturbed)"
    )
