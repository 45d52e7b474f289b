"""pitstop: measure why PyTorch training is slow on this machine, prove the fix, apply it."""

from typing import Any

from pitstop.findings import Finding, Report, Severity
from pitstop.version import __version__

__all__ = ["Finding", "Profiler", "Report", "Severity", "StopProfiling", "__version__"]


def __getattr__(name: str) -> Any:
    # served lazily: `import pitstop` stays free of torch
    if name == "Profiler":
        from pitstop.integrations.profiler import Profiler

        return Profiler
    if name == "StopProfiling":
        from pitstop.profile.capture.hooks import StopProfiling

        return StopProfiling
    raise AttributeError(f"module 'pitstop' has no attribute {name!r}")
