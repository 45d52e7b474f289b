"""Binary byte units and the short forms reports print them in."""

from __future__ import annotations

KiB = 2**10
MiB = 2**20
GiB = 2**30


def gib(n: float | None) -> str:
    """``3.2 GiB``; ``?`` where the number is unknown."""
    return "?" if n is None else f"{n / GiB:.1f} GiB"


def size(n: float) -> str:
    """``12.0 MiB`` from a mebibyte up, ``512.0 KiB`` below it."""
    return f"{n / MiB:.1f} MiB" if n >= MiB else f"{n / KiB:.1f} KiB"
