"""Host-sync wrappers: ``Tensor.item/tolist/numpy/cpu/__float__/__int__/__bool__/__index__/__repr__/
__format__``, counted and timed at the user's line. Installed by ``Instrumentation`` (hooks.py), which
holds the counters they update."""

from __future__ import annotations

import functools
import sys
import time
from typing import TYPE_CHECKING, Any

import torch

from pitstop.profile.where import is_user_file, user_location

if TYPE_CHECKING:
    from pitstop.profile.hooks import Instrumentation

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


# The per-element loop's methods (``bool(t[i] == y[i])``, ``t[i].item()``) take no argument: their
# wrapper has no *args/**kwargs (packing them costs ~0.3 us a call) and counts a repeat call inline.
_NO_ARGS = frozenset({"item", "tolist", "__float__", "__int__", "__bool__", "__index__"})


def make_sync(inst: Instrumentation, name: str, orig: Any) -> Any:
    """A wrapper for one sync method. Sites are keyed (id(code), bytecode offset, method); only user
    lines (or, for device tensors, the user line found by walking the stack) become sites.

    Hot path (per-element loops call it thousands of times a step): a CPU tensor at a known site costs one
    clock read, and the time since the previous sync, when under ``LOOP_GAP_S``, is the per-element loop's
    cost (the previous call plus the Python between). Device tensors, nesting methods and methods with
    arguments are timed around the call, under the in_sync guard."""
    getframe = sys._getframe

    if name not in _NO_ARGS:

        @functools.wraps(orig)
        def wrapper(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            if inst.in_sync:  # nested in a sync we time, or inside DataLoader.__next__ (data wait)
                return orig(self, *args, **kwargs)
            return _sync(inst, name, orig, self, args, kwargs, getframe(1))

        return wrapper

    @functools.wraps(orig)
    def wrapper0(self: torch.Tensor) -> Any:
        if inst.in_sync:
            return orig(self)
        frame = getframe(1)
        # f_lasti (the call's bytecode offset), not f_lineno: the line number is computed by scanning the
        # code's line table, microseconds in a long function
        if (
            frame.f_code is inst._last_code
            and frame.f_lasti == inst._last_lasti
            and name is inst._last_name
            and self.is_cpu
        ):  # the same call as the previous sync, on the CPU: a per-element loop
            _count_cpu(inst, inst._last_site)
            return orig(self)
        if frame.f_code is inst._ignored_code and frame.f_lasti == inst._ignored_lasti and self.is_cpu:
            return orig(self)  # the last library call found not to be a sync (Adam's step.item()), again
        return _sync(inst, name, orig, self, (), {}, frame)

    return wrapper0


def _sync(
    inst: Instrumentation, name: str, orig: Any, t: torch.Tensor, args: Any, kwargs: Any, frame: Any
) -> Any:
    """Any call but a repeat of the previous CPU sync: find (or make) its site, then time it."""
    code, at = frame.f_code, frame.f_lasti
    key = (id(code), at, name)  # id(code): hashing a code object hashes its bytecode
    site = inst._sites.get(key)
    if site is None:
        if t.is_cpu and inst._cpu_ignored.get(key) is code:
            inst._ignored_code, inst._ignored_lasti = code, at
            return orig(t, *args, **kwargs)  # library code's CPU .item() (e.g. the optimizer's step count)
        return _first_sync(inst, name, orig, t, args, kwargs, frame)
    if name in _NO_ARGS and t.is_cpu:  # a known site, on the CPU: count it as the repeat path does
        inst._last_code, inst._last_lasti, inst._last_name = code, at, name
        _count_cpu(inst, site)
        return orig(t, *args, **kwargs)
    return _timed_sync(inst, site, orig, t, args, kwargs)


def _count_cpu(inst: Instrumentation, site: list[Any]) -> None:
    """One CPU sync at ``site``, not timed around the call: the time since the previous sync, when under
    ``LOOP_GAP_S``, is the per-element loop's cost (the previous call plus the Python between)."""
    t = clock()
    dt = t - inst._last_sync_end
    if dt < LOOP_GAP_S:
        inst.sync += dt
        if inst.warm_done:
            site[3] += dt
    inst._last_site = site
    inst._last_sync_end = t
    inst.n_syncs += 1
    site[0] += 1
    site[2] += inst.warm_done


def new_site(
    inst: Instrumentation, key: tuple[Any, ...], code: Any, line: int, name: str, lasti: int = -1
) -> list[Any]:
    # [calls, measured seconds, measured calls, measured loop seconds, code, line, method, bytecode offset]
    site = inst._sites.get(key)
    if site is None:
        site = inst._sites[key] = [0, 0.0, 0, 0.0, code, line, name, lasti]
    return site


def _first_sync(
    inst: Instrumentation, name: str, orig: Any, t: torch.Tensor, args: Any, kwargs: Any, frame: Any
) -> Any:
    """A sync from a call site not seen yet: decide whether it counts, and make its site."""
    code, at = frame.f_code, frame.f_lasti
    if t.is_cpu:
        # CPU: no device to wait for; count calls made directly from user code, so the same logic that
        # finds GPU syncs runs (and is shown) on a CPU run. `.cpu()` of a CPU tensor is a no-op.
        if name == "cpu" or not user_code(code):
            inst._cpu_ignored[(id(code), at, name)] = code  # the next call from here takes the fast path
            return orig(t, *args, **kwargs)
        site = new_site(inst, (id(code), at, name), code, frame.f_lineno, name, at)
    elif user_code(code):
        site = new_site(inst, (id(code), at, name), code, frame.f_lineno, name, at)
    else:  # on a device, called through library code: the site is the user's line up the stack
        where = user_location(3) or "<library>"
        site = new_site(inst, (where, 0, name), None, 0, name)
    return _timed_sync(inst, site, orig, t, args, kwargs)


def _timed_sync(
    inst: Instrumentation, site: list[Any], orig: Any, t: torch.Tensor, args: Any, kwargs: Any
) -> Any:
    inst.in_sync = True
    start = clock()
    try:
        return orig(t, *args, **kwargs)
    finally:
        end = clock()
        inst.in_sync = False
        dt = end - start
        inst.sync += dt
        inst.n_syncs += 1
        site[0] += 1
        if inst.warm_done:  # time and loop gaps over the measured steps only
            site[1] += dt
            site[2] += 1
            # a per-element loop of syncs: the time since the previous one is the loop's too
            if start - inst._last_sync_end < LOOP_GAP_S:
                site[3] += start - inst._last_sync_end
                inst.sync += start - inst._last_sync_end
        inst._last_site = site
        inst._last_sync_end = end
        inst._last_code, inst._last_lasti, inst._last_name = site[4], site[7], site[6]


USER_CODE: dict[int, tuple[Any, bool]] = {}


def user_code(code: Any) -> bool:
    hit = USER_CODE.get(id(code))
    if hit is None or hit[0] is not code:
        hit = USER_CODE[id(code)] = (code, is_user_file(code.co_filename))
    return hit[1]


# ------------------------------------------------------------------------------------------- facts
