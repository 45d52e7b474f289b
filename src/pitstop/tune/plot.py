"""PNG plots of measured curves (loader sweep, LR range test) with matplotlib's Agg backend (no display)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path


def save_line_png(
    path: str | os.PathLike[str],
    x: Sequence[float],
    series: dict[str, Sequence[float]],
    *,
    title: str = "",
    xlabel: str = "",
    ylabel: str = "",
    logx: bool = False,
    marks: dict[str, float] | None = None,
) -> Path:
    """One line per series over a shared x; ``marks`` draws labelled vertical lines (e.g. a suggested lr)."""
    from pitstop.plotting import matplotlib_agg

    matplotlib_agg()
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4), dpi=110)
    ax = fig.add_subplot()
    for name, ys in series.items():
        ax.plot(list(x)[: len(ys)], list(ys), label=name, marker="o" if len(x) <= 20 else None)
    for name, xv in (marks or {}).items():
        ax.axvline(xv, linestyle="--", color="gray")
        ax.annotate(name, (xv, 1), xycoords=("data", "axes fraction"), rotation=90, va="top", ha="right")
    if logx:
        ax.set_xscale("log")
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    if len(series) > 1:
        ax.legend()
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="png")
    return out
