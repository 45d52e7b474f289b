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


def duration(s: float | None) -> str:
    """A duration with 3 significant digits in the unit that reads best: ``850 us``, ``65.2 ms``,
    ``1.75 s``, ``125 s``; ``?`` where unknown. Negative values keep their sign."""
    if s is None or s != s:
        return "?"
    a = abs(s)
    if a >= 0.9995:
        text = f"{a:.3g} s" if a < 999.5 else f"{a:.0f} s"
    elif a >= 0.0009995:
        text = f"{a * 1e3:.3g} ms"
    elif a == 0:
        return "0 ms"
    else:
        text = f"{a * 1e6:.3g} us"
    return ("-" if s < 0 else "") + text


def sig3(v: float) -> str:
    """A rate or count with 3 significant digits and no exponent: ``0.167``, ``15.1``, ``2,330``."""
    return f"{v:,.0f}" if abs(v) >= 999.5 else f"{v:.3g}"
