"""Forwards called as ``model.forward(x)``: torch's module hooks run only inside ``Module.__call__``, so
such a call is seen by its first effect, a call of one of the model's submodules that no module call
encloses. From there the Python stack names the module whose ``forward`` runs (its frame's ``self``),
and the forward is timed from that call to the end of the last submodule call inside it
(``pitstop.profile.capture.models``). Nothing is patched and nothing is stored on the model.

The forward's inputs are read from its frame where its parameters still hold them: where the code
before the current line assigns to a parameter (``x = x.view(...)`` before ``self.fc1(x)``), the
inputs are not known, and the probes that need them do not run.
"""

from __future__ import annotations

import dis
import inspect
from types import CodeType, FrameType
from typing import Any

import torch

MAX_FRAMES = 64  # how far up the stack a direct forward's frame is looked for
_VARARGS, _VARKEYWORDS = inspect.CO_VARARGS, inspect.CO_VARKEYWORDS
_stores: dict[CodeType, list[int]] = {}  # code -> offsets of its stores to a parameter


def forward_frame_module(f: FrameType) -> torch.nn.Module | None:
    """The module whose own ``forward`` runs in frame ``f``, if any."""
    code = f.f_code
    if code.co_name != "forward" or not code.co_argcount:
        return None
    obj = f.f_locals.get(code.co_varnames[0])
    if not isinstance(obj, torch.nn.Module):
        return None
    fn = inspect.unwrap(getattr(type(obj), "forward", None))
    return obj if getattr(fn, "__code__", None) is code else None


def outermost_forward(start: FrameType | None) -> tuple[torch.nn.Module, FrameType] | None:
    """The outermost module with parameters whose ``forward`` runs on the stack above ``start``: with no
    module call open, each was called directly."""
    found = None
    f, n = start, 0
    while f is not None and n < MAX_FRAMES:
        m = forward_frame_module(f)
        if m is not None and next(m.parameters(), None) is not None:
            found = (m, f)
        f, n = f.f_back, n + 1
    return found


def near_forward(start: FrameType | None, frames: int = 6) -> bool:
    """Whether a function named ``forward`` runs within ``frames`` frames above ``start`` (a cheap test
    before ``outermost_forward``)."""
    f, n = start, 0
    while f is not None and n < frames:
        if f.f_code.co_name == "forward":
            return True
        f, n = f.f_back, n + 1
    return False


def on_stack(frame: FrameType, start: FrameType | None) -> bool:
    f, n = start, 0
    while f is not None and n < MAX_FRAMES:
        if f is frame:
            return True
        f, n = f.f_back, n + 1
    return False


def frame_inputs(f: FrameType) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
    """The arguments ``forward`` was called with (less ``self``), from its frame; None where the code run
    so far may have assigned to one of its parameters."""
    code = f.f_code
    if any(offset < f.f_lasti for offset in _param_stores(code)):
        return None
    names, loc = code.co_varnames, f.f_locals
    n, kwonly = code.co_argcount, code.co_kwonlyargcount
    try:
        args = [loc[name] for name in names[1:n]]
        kwargs = {name: loc[name] for name in names[n : n + kwonly]}
        i = n + kwonly
        if code.co_flags & _VARARGS:
            args += list(loc[names[i]])
            i += 1
        if code.co_flags & _VARKEYWORDS:
            kwargs.update(loc[names[i]])
    except KeyError:  # a parameter deleted
        return None
    return tuple(args), kwargs


def _param_stores(code: CodeType) -> list[int]:
    stores = _stores.get(code)
    if stores is None:
        n = code.co_argcount + code.co_kwonlyargcount
        n += bool(code.co_flags & _VARARGS) + bool(code.co_flags & _VARKEYWORDS)
        params = set(code.co_varnames[:n])
        stores = _stores[code] = [
            ins.offset
            for ins in dis.get_instructions(code)
            if ins.opname.startswith(("STORE_FAST", "DELETE_FAST")) and params & _names(ins.argval)
        ]
    return stores


def _names(argval: Any) -> set[str]:
    """The local names an instruction stores to (a tuple for 3.13's STORE_FAST_STORE_FAST and kin)."""
    return set(argval) if isinstance(argval, tuple) else {argval}
