"""Host-sync wrappers: ``Tensor.item/tolist/numpy/cpu/__float__/__int__/__bool__/__index__/__repr__/
__format__``, counted and timed at the user's line. ``SyncSites`` holds the sites and the per-step count;
their time goes to the step clock's sync phase.

Sampled by step: the warm-up and the first ``SAMPLE_FIRST`` measured steps are all measured, then one
step in ``SAMPLE_EVERY``, and from measured step ``SAMPLE_LATE_FROM`` on one in ``SAMPLE_EVERY_LATE``. On
the others (``light``) ``SyncWrappers`` takes the wrappers off ``torch.Tensor`` (a per-element loop of
syncs paid ~0.75 us a call for the stack and clock reads, ~2% of a 3 ms step, and still ~0.37 us a call
passing through a wrapper), so their syncs' time stays in the phase they ran in (forward, or "other" for
a loop after the step). ``close_step`` fills such a step's count from the sampled steps' mean, and moves
the sampled steps' mean sync time in each phase out of that phase into the sync phase (leaving the phase
at least its sampled median without syncs): the parts still add up, and no second counts twice. ``rows``
scales the sites' measured counts and times to every measured step, and
says from how many they came."""

from __future__ import annotations

import contextlib
import functools
import statistics
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from pitstop.profile.capture.stepclock import CLOSURE, PHASES, SYNC, PhaseClock
from pitstop.profile.capture.where import is_user_file, location, user_location

if TYPE_CHECKING:
    from pitstop.profile.capture.patches import Patches

clock = time.perf_counter
SYNC_METHODS = (
    "item",
    "tolist",
    "numpy",
    "cpu",
    "__float__",
    "__int__",
    "__bool__",
    "__index__",
    "__repr__",
    "__format__",
)
LOOP_GAP_S = 0.0001  # syncs closer than this to the previous one are one per-element loop
SAMPLE_FIRST = 10  # measured steps whose syncs are all measured before sampling starts
SAMPLE_EVERY = 8  # then one measured step in this many
# from this measured step on (the sites' counts have settled over 17 sampled steps), one in SAMPLE_EVERY_LATE:
# a sampled step of a per-element loop costs its wrapper calls and two swaps of Tensor's methods (each a
# type change that resets the interpreter's attribute caches for every tensor)
SAMPLE_LATE_FROM = 64
SAMPLE_EVERY_LATE = 32
OTHER = "other"  # no phase open around a sync: its time would be the step's "other"
# where a sync can run: the phases (an optimizer closure's own Python is "other" in a record), or none
_AROUND = (*PHASES, CLOSURE, OTHER)
_HOLDS = (*(p for p in PHASES if p != SYNC), OTHER)  # the parts of a record a sync's time can be in


# The per-element loop's methods (``bool(t[i] == y[i])``, ``t[i].item()``) take no argument: their
# wrapper has no *args/**kwargs (packing them costs ~0.3 us a call) and counts a repeat call inline.
_NO_ARGS = frozenset({"item", "tolist", "__float__", "__int__", "__bool__", "__index__"})


def _parts_sum(rec: dict[str, Any]) -> float:
    """The record's phase seconds added up (``PHASES``, in their order; no generator on this per-step path)."""
    return sum(map(rec.__getitem__, PHASES))


def is_light(measured_index: int) -> bool:
    """Whether the measured step ``measured_index`` (negative: warm-up) is not sampled."""
    if measured_index < SAMPLE_FIRST:
        return False
    return measured_index % (SAMPLE_EVERY if measured_index < SAMPLE_LATE_FROM else SAMPLE_EVERY_LATE) != 0


class SyncSites:
    """The run's sync sites and the current step's sync count.

    A site is ``[calls, measured seconds, measured calls, measured loop seconds, code, line, method,
    bytecode offset]``, keyed (id(code), bytecode offset, method), or (file:line, 0, method) for a
    device sync found through library code. ``busy``: inside a sync being timed, or inside data loading
    (data wait, not syncs): calls pass through. ``measuring``: after warm-up, times and measured counts
    accumulate. ``light``: a step not sampled, calls pass through uncounted. ``inside``: the current
    step's sync seconds by the phase open around them (``OTHER``: none); ``sampled_inside``: summed over
    the sampled measured steps; ``sampled_left``: each of those steps' seconds in each part beside the syncs.
    """

    def __init__(self, phases: PhaseClock) -> None:
        self.phases = phases
        self.busy = False
        self.light = False
        self.cuda_debug = False  # torch's sync debug mode on (a warning per sync): off on steps not sampled
        self.measuring = False
        self.count = 0
        self.sites: dict[tuple[Any, ...], list[Any]] = {}
        self.cpu_ignored: dict[tuple[Any, ...], Any] = {}  # sites (-> code) whose CPU syncs do not count
        self.ignored_code: Any = None  # the last of those seen, for a one-comparison repeat check
        self.ignored_lasti = -1
        self.last_site: list[Any] | None = None  # the sync site called last, and its code/offset/method
        self.last_code: Any = None
        self.last_lasti = -1
        self.last_name = ""
        self.last_end = -1.0
        # measured steps closed, and of those the sampled ones with their summed sync seconds and counts
        self.steps_measured = self.steps_sampled = self.sampled_syncs = 0
        self.inside = dict.fromkeys(_AROUND, 0.0)
        self.sampled_inside = dict.fromkeys(_HOLDS, 0.0)
        self.sampled_left: dict[str, list[float]] = {p: [] for p in _HOLDS}
        # per part: the sampled steps' mean sync seconds and median seconds beside them (``_takes``), made
        # at the next step not sampled
        self._moves: list[tuple[str, float, float]] | None = None
        self.wear: Callable[[bool], None] | None = None  # puts the wrappers on (True) or off (SyncWrappers)

    def new_step(self, measured_index: int = -1) -> None:
        """A step begins; ``measured_index``: its index among the measured steps (negative: warm-up)."""
        light = is_light(measured_index)
        if light != self.light:
            if self.cuda_debug:
                with contextlib.suppress(Exception):  # inside the user's step: never raise there
                    torch.cuda.set_sync_debug_mode(0 if light else "warn")
            if self.wear is not None:
                self.wear(not light)
        self.light = light
        self.count = 0
        if not light:  # a step not sampled neither fills nor reads it
            self.inside = dict.fromkeys(_AROUND, 0.0)
        self.last_site = None
        self.last_code = None
        self.last_end = -1.0  # no loop spans a step boundary

    def reset_measured(self) -> None:
        """Forget measured times and counts (the steps they belonged to were dropped)."""
        for site in self.sites.values():
            site[1], site[2], site[3] = 0.0, 0, 0.0
        self.steps_measured = self.steps_sampled = self.sampled_syncs = 0
        self.sampled_inside = dict.fromkeys(_HOLDS, 0.0)
        self.sampled_left = {p: [] for p in _HOLDS}
        self._moves = None

    def close_step(self, rec: dict[str, Any]) -> None:
        """Put the closing step's sync count in its record ``rec``. A step not sampled gets the sampled
        steps' mean count, ``sync_sampled`` False, and sync seconds moved into ``rec``'s sync phase out of
        each phase its untimed syncs ran in (``OTHER``: the time no phase covered): the sampled steps'
        mean sync seconds in that phase, at most what the step spent there beyond the sampled steps' median
        time in it without syncs (the timed wrappers cost more than the syncs; the phase's own work stays)."""
        if not self.light:
            rec["syncs"] = self.count
            if not rec["warmup"]:
                self.steps_measured += 1
                self.steps_sampled += 1
                self.sampled_syncs += self.count
                inside = self.inside
                inside[OTHER] += inside[CLOSURE]  # an optimizer closure's own Python is "other" in a record
                rest = rec["total_s"] - _parts_sum(rec)
                for phase in _HOLDS:
                    self.sampled_inside[phase] += inside[phase]
                    self.sampled_left[phase].append(rest if phase == OTHER else rec[phase])
                self._moves = None
            return
        self.steps_measured += 1
        n = max(1, self.steps_sampled)
        takes = self._moves
        if takes is None:  # changes with the sampled steps only: made once for the steps after them
            takes = self._moves = self._takes(n)
        rest = rec["total_s"] - _parts_sum(rec)
        moved = 0.0
        for phase, mean, floor in takes:
            if phase == OTHER:
                moved += max(0.0, min(mean, rest - floor))
            else:
                take = max(0.0, min(mean, rec[phase] - floor))
                rec[phase] -= take
                moved += take
        rec[SYNC] += moved
        rec["syncs"] = self.sampled_syncs / n
        rec["sync_sampled"] = False

    def _takes(self, n: int) -> list[tuple[str, float, float]]:
        """(part, the sampled steps' mean sync seconds in it, their median seconds in it beside the syncs)
        for each part that held syncs; a median: a sampled step held up in a part (GC) does not move it."""
        out = []
        for phase in _HOLDS:
            s = self.sampled_inside[phase]
            if s > 0.0:
                left = self.sampled_left[phase]
                out.append((phase, s / n, statistics.median(left) if left else 0.0))
        return out

    def site(self, key: tuple[Any, ...], code: Any, line: int, name: str, lasti: int = -1) -> list[Any]:
        site = self.sites.get(key)
        if site is None:
            site = self.sites[key] = [0, 0.0, 0, 0.0, code, line, name, lasti]
        return site

    def record_cuda_sync(self, where: Callable[[], str | None]) -> None:
        """One sync reported by torch's sync debug mode (no duration: it is not ours to time); ``where``
        finds its user line, called (a stack walk) only for a sync that counts."""
        if self.busy or self.light:
            return  # a sync our own wrappers are already timing, inside data loading, or not sampled
        self.count += 1
        site = self.site((where() or "<library>", 0, "cuda-sync"), None, 0, "cuda-sync")
        site[0] += 1
        site[2] += self.measuring

    def rows(self) -> list[dict[str, Any]]:
        """One row per (location, method); several call sites on one line add up. Counts and measured
        times are scaled from the sampled steps to every measured step (``sampled_steps`` of
        ``measured_steps`` say so, where some were not sampled)."""
        rows: dict[tuple[str, str], dict[str, Any]] = {}
        sampled, measured = self.steps_sampled, self.steps_measured
        scale = measured / sampled if 0 < sampled < measured else 1.0
        for (where, _at, method), (count, time_s, n_measured, loop_s, code, line, *_) in self.sites.items():
            at = where if isinstance(where, str) else location(code.co_filename, line)
            row = rows.setdefault(
                (at, method),
                {
                    "location": at,
                    "method": method,
                    "count": 0,
                    "time_s": 0.0,
                    "measured_count": 0,
                    "loop_gap_s": 0.0,
                },
            )
            # the calls counted (warm-up and sampled steps), plus the measured ones the sampling skipped
            row["count"] += count + round(n_measured * (scale - 1.0))
            row["time_s"] += time_s * scale
            row["measured_count"] += n_measured * scale
            row["loop_gap_s"] += loop_s * scale
            if scale != 1.0:
                row["sampled_steps"], row["measured_steps"] = sampled, measured
        return list(rows.values())


class SyncWrappers:
    """The sync wrappers on ``torch.Tensor`` (``install``, undone by the ``Patches``' undo), taken off for
    the steps not sampled and put back for the sampled ones: a step not sampled then pays nothing a sync
    (at two attribute swaps per ``SAMPLE_EVERY`` steps). Left on once ``torch.compile`` has compiled a
    frame, so that a compiled graph never sees ``Tensor``'s methods change under it."""

    def __init__(self, st: SyncSites) -> None:
        self.st = st
        self.table: list[tuple[str, bool, Any, Any]] = []  # name, in Tensor's own dict, its value there, wrapper
        self.on = False

    def install(self, patches: Patches) -> None:
        tensor = torch.Tensor
        for name in SYNC_METHODS:
            had, orig = name in tensor.__dict__, tensor.__dict__.get(name)
            wrapper = make_sync(self.st, name, getattr(tensor, name))
            patches.patch(tensor, name, wrapper)
            self.table.append((name, had, orig, wrapper))
        self.on = True
        self.st.wear = self.wear

    def uninstalled(self) -> None:
        """The patches were undone: the wrappers stay off."""
        self.st.wear = None
        self.table, self.on = [], False

    def wear(self, on: bool) -> None:
        if on == self.on or not self.table:
            return
        if not on and _compiled():
            return
        tensor = torch.Tensor
        for name, had, orig, wrapper in self.table:
            if on:
                setattr(tensor, name, wrapper)
            elif had:
                setattr(tensor, name, orig)
            else:
                delattr(tensor, name)
        self.on = on


def _compiled() -> bool:
    """Whether torch.compile (dynamo) has compiled a frame in this process."""
    utils = sys.modules.get("torch._dynamo.utils")
    counters = getattr(utils, "counters", None)
    return bool(counters and counters.get("frames", {}).get("total"))


def make_sync(st: SyncSites, name: str, orig: Any) -> Any:
    """A wrapper for one sync method. Sites are keyed (id(code), bytecode offset, method); only user
    lines (or, for device tensors, the user line found by walking the stack) become sites.

    Hot path (per-element loops call it thousands of times a step): a CPU tensor at a known site costs one
    clock read, and the time since the previous sync, when under ``LOOP_GAP_S``, is the per-element loop's
    cost (the previous call plus the Python between). Device tensors, nesting methods and methods with
    arguments are timed around the call, under the ``busy`` guard."""
    getframe = sys._getframe

    if name not in _NO_ARGS:

        @functools.wraps(orig)
        def wrapper(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            if st.busy or st.light:  # nested in a sync we time, in DataLoader.__next__, not sampled
                return orig(self, *args, **kwargs)
            return _sync(st, name, orig, self, args, kwargs, getframe(1))

        return wrapper

    @functools.wraps(orig)
    def wrapper0(self: torch.Tensor) -> Any:
        if st.busy or st.light:
            return orig(self)
        frame = getframe(1)
        # f_lasti (the call's bytecode offset), not f_lineno: the line number is computed by scanning the
        # code's line table, microseconds in a long function
        if (
            frame.f_code is st.last_code
            and frame.f_lasti == st.last_lasti
            and name is st.last_name
            and self.is_cpu
        ):  # the same call as the previous sync, on the CPU: a per-element loop
            # _count_cpu and PhaseClock.move inlined: this line runs once per element of the loop
            t = clock()
            dt = t - st.last_end
            site = st.last_site
            if dt < LOOP_GAP_S:
                ph = st.phases
                around = ph.stack[-1] if ph.stack else OTHER
                if ph.spans is None:
                    if ph.stack:
                        gap = t - dt - ph.mark
                        if gap > 0.0:
                            ph.acc[around] += gap
                    ph.acc[SYNC] += dt
                    ph.mark = t
                else:
                    ph.move(SYNC, dt, t)
                st.inside[around] += dt
                if st.measuring:
                    site[3] += dt
                    site[2] += 1
            elif st.measuring:
                site[2] += 1
            st.last_end = t
            st.count += 1
            site[0] += 1
            return orig(self)
        if frame.f_code is st.ignored_code and frame.f_lasti == st.ignored_lasti and self.is_cpu:
            return orig(self)  # the last library call found not to be a sync (Adam's step.item()), again
        return _sync(st, name, orig, self, (), {}, frame)

    return wrapper0


def _sync(st: SyncSites, name: str, orig: Any, t: torch.Tensor, args: Any, kwargs: Any, frame: Any) -> Any:
    """Any call but a repeat of the previous CPU sync: find (or make) its site, then time it."""
    code, at = frame.f_code, frame.f_lasti
    key = (id(code), at, name)  # id(code): hashing a code object hashes its bytecode
    site = st.sites.get(key)
    if site is None:
        if t.is_cpu and st.cpu_ignored.get(key) is code:
            st.ignored_code, st.ignored_lasti = code, at
            return orig(t, *args, **kwargs)  # library code's CPU .item() (e.g. the optimizer's step count)
        return _first_sync(st, name, orig, t, args, kwargs, frame)
    if name in _NO_ARGS and t.is_cpu:  # a known site, on the CPU: count it as the repeat path does
        st.last_code, st.last_lasti, st.last_name = code, at, name
        _count_cpu(st, site)
        return orig(t, *args, **kwargs)
    return _timed_sync(st, site, orig, t, args, kwargs)


def _count_cpu(st: SyncSites, site: list[Any]) -> None:
    """One CPU sync at ``site``, not timed around the call: the time since the previous sync, when under
    ``LOOP_GAP_S``, is the per-element loop's cost (the previous call plus the Python between)."""
    t = clock()
    dt = t - st.last_end
    if dt < LOOP_GAP_S:
        st.phases.move(SYNC, dt, t)
        st.inside[st.phases.stack[-1] if st.phases.stack else OTHER] += dt
        if st.measuring:
            site[3] += dt
    st.last_site = site
    st.last_end = t
    st.count += 1
    site[0] += 1
    site[2] += st.measuring


def _first_sync(
    st: SyncSites, name: str, orig: Any, t: torch.Tensor, args: Any, kwargs: Any, frame: Any
) -> Any:
    """A sync from a call site not seen yet: decide whether it counts, and make its site."""
    code, at = frame.f_code, frame.f_lasti
    if t.is_cpu:
        # CPU: no device to wait for; count calls made directly from user code, so the same logic that
        # finds GPU syncs runs (and is shown) on a CPU run. `.cpu()` of a CPU tensor is a no-op.
        if name == "cpu" or not user_code(code):
            st.cpu_ignored[(id(code), at, name)] = code  # the next call from here takes the fast path
            return orig(t, *args, **kwargs)
        site = st.site((id(code), at, name), code, frame.f_lineno, name, at)
    elif user_code(code):
        site = st.site((id(code), at, name), code, frame.f_lineno, name, at)
    else:  # on a device, called through library code: the site is the user's line up the stack
        where = user_location(3) or "<library>"
        site = st.site((where, 0, name), None, 0, name)
    return _timed_sync(st, site, orig, t, args, kwargs)


def _timed_sync(st: SyncSites, site: list[Any], orig: Any, t: torch.Tensor, args: Any, kwargs: Any) -> Any:
    st.busy = True
    start = clock()
    gap = start - st.last_end
    around = st.phases.stack[-1] if st.phases.stack else OTHER
    if gap < LOOP_GAP_S:  # a per-element loop of syncs: the time since the previous one is the loop's too
        st.phases.move(SYNC, gap, start)
    st.phases.enter(SYNC, start)
    try:
        return orig(t, *args, **kwargs)
    finally:
        end = clock()
        st.phases.exit(SYNC, end)
        st.inside[around] += end - start + (gap if gap < LOOP_GAP_S else 0.0)
        st.busy = False
        st.count += 1
        site[0] += 1
        if st.measuring:  # time and loop gaps over the measured steps only
            site[1] += end - start
            site[2] += 1
            if gap < LOOP_GAP_S:
                site[3] += gap
        st.last_site = site
        st.last_end = end
        st.last_code, st.last_lasti, st.last_name = site[4], site[7], site[6]


USER_CODE: dict[int, tuple[Any, bool]] = {}


def user_code(code: Any) -> bool:
    hit = USER_CODE.get(id(code))
    if hit is None or hit[0] is not code:
        hit = USER_CODE[id(code)] = (code, is_user_file(code.co_filename))
    return hit[1]
