"""Where in the user's code something happened: ``file:line`` of the innermost frame outside torch,
pitstop, the standard library and installed packages."""

from __future__ import annotations

import functools
import os
import sys
import sysconfig
from typing import Any

import torch


def _library_prefixes() -> tuple[str, ...]:
    paths = {sysconfig.get_paths().get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    paths.add(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # pitstop
    paths.add(os.path.dirname(os.path.abspath(torch.__file__)))
    return tuple(sorted(p.rstrip(os.sep) + os.sep for p in paths if p))


_LIB_PREFIXES = _library_prefixes()


@functools.cache
def is_user_file(filename: str) -> bool:
    """Code the user wrote: not the standard library, not an installed package, not pitstop or torch."""
    if not filename or filename.startswith("<"):
        return False
    return not os.path.abspath(filename).startswith(_LIB_PREFIXES)


# (id(code), bytecode offset) -> (code, "file:line"): a frame's f_lineno scans its code's line table,
# microseconds in a long script, and the same call sites (a loop's backward, a collective) come every step
_SITES: dict[tuple[int, int], tuple[Any, str]] = {}


def user_location(depth: int = 2) -> str | None:
    """``file:line`` of the innermost frame in user code, walking out from the caller's caller."""
    try:
        frame = sys._getframe(depth)
    except ValueError:
        return None
    while frame is not None:
        code = frame.f_code
        if is_user_file(code.co_filename):
            key = (id(code), frame.f_lasti)
            hit = _SITES.get(key)
            if hit is None:  # the entry holds its code object, so no other code can take its id
                hit = _SITES[key] = (code, location(code.co_filename, frame.f_lineno))
            return hit[1]
        frame = frame.f_back
    return None


@functools.cache
def location(filename: str, line: int) -> str:
    return f"{_short(filename)}:{line}"


def _short(filename: str) -> str:
    try:
        rel = os.path.relpath(filename)
    except ValueError:
        return filename
    return rel if not rel.startswith("..") else filename
