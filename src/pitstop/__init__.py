"""pitstop: measure why PyTorch training is slow on this machine, prove the fix, apply it."""

from pitstop.findings import Finding, Report, Severity

__version__ = "0.1.0"
__all__ = ["Finding", "Report", "Severity", "__version__"]
