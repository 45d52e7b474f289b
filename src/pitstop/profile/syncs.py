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


_NESTING_SYNCS = frozenset({"__repr__", "__format__"})  # call other syncs inside: need the in_sync guard


def make_sync(inst: Instrumentation, name: str, orig: Any) -> Any:
    """A wrapper for one sync method. Sites are keyed (id(code), line, method); only user lines (or, for
    device tensors, the user line found by walking the stack) become sites.

    Hot path (per-element loops call it thousands of times a step): a CPU tensor at a known site costs one
    clock read, and the time since the previous sync, when under ``LOOP_GAP_S``, is the per-element loop's
    cost (the previous call plus the Python between). Device tensors and nesting methods are timed around
    the call, under the in_sync guard."""
    sites = inst._sites
    getframe = sys._getframe
    fast = name not in _NESTING_SYNCS

    @functools.wraps(orig)
    def wrapper(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if inst.in_sync:  # nested in a sync we time, or inside DataLoader.__next__ (data wait)
            return orig(self, *args, **kwargs)
        frame = getframe(1)
        code = frame.f_code
        # f_lasti (the call's bytecode offset), not f_lineno: the line number is computed by scanning the
        # code's line table, microseconds in a long function
        at = frame.f_lasti
        if code is inst._last_code and at == inst._last_lasti and name is inst._last_name:
            site = inst._last_site  # the same call as the previous sync: a per-element loop
        else:
            # id(code): hashing a code object hashes its bytecode; USER_CODE keeps the object alive
            site = sites.get((id(code), at, name))
            if site is None:
                return _first_sync(inst, name, orig, self, args, kwargs, frame)
            inst._last_code, inst._last_lasti, inst._last_name = code, at, name
        if fast and self.is_cpu:
            t = clock()
            dt = t - inst._last_sync_end
            if dt < LOOP_GAP_S:  # the previous call and the loop since: this per-element loop's cost
                inst.sync += dt
                if inst.warm_done:
                    site[3] += dt
            inst._last_site = site
            inst._last_sync_end = t
            inst.n_syncs += 1
            site[0] += 1
            site[2] += inst.warm_done
            return orig(self, *args, **kwargs)
        return _timed_sync(inst, site, orig, self, args, kwargs)

    return wrapper


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
