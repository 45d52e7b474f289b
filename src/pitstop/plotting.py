"""matplotlib for the PNG outputs (``bench --png``, ``monitor --plot``, ``tune ... --plot``): the optional
``[plot]`` extra. Without it those options say how to install it instead of raising ImportError."""

from __future__ import annotations

from types import ModuleType

INSTALL = "pip install 'pitstop[plot]' (or pip install matplotlib)"


class PlotUnavailable(ImportError):
    """matplotlib is not installed."""


def matplotlib_agg() -> ModuleType:
    """matplotlib on its Agg backend (no display needed), or PlotUnavailable with the install line."""
    try:
        import matplotlib
    except ImportError as e:
        raise PlotUnavailable(f"PNG output needs matplotlib, which is not installed: {INSTALL}") from e
    matplotlib.use("Agg", force=False)
    return matplotlib


def unavailable(option: str) -> str | None:
    """The message for a command line option that writes a PNG, or None when it can."""
    try:
        matplotlib_agg()
    except PlotUnavailable:
        return f"{option} needs matplotlib, which is not installed: {INSTALL}"
    return None
