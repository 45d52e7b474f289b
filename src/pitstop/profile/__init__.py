"""``pitstop profile``: run an unmodified training script, time every step, rank what costs time.

    from pitstop.profile import RunSpec, run
    result = run(RunSpec(["python", "train.py"], steps=20))
    result.report()          # Findings + sections, as the CLI shows them

The script runs in a child process (``pitstop.profile.process.bootstrap``) with the hooks of
``pitstop.profile.capture.hooks``; it is stopped after the measured steps by raising ``StopProfiling`` inside it.
``StopProfiling`` and ``Captured`` are served lazily so importing this package does not import torch.
"""

from typing import Any

from pitstop.profile.record.overrides import Overrides
from pitstop.profile.runs.runner import CommandError, RunResult, RunSpec, parse_command, run


def __getattr__(name: str) -> Any:
    if name in ("StopProfiling", "Captured"):
        from pitstop.profile.capture import hooks

        return getattr(hooks, name)
    raise AttributeError(f"module 'pitstop.profile' has no attribute {name!r}")


__all__ = [
    "Captured",
    "CommandError",
    "Overrides",
    "RunResult",
    "RunSpec",
    "StopProfiling",
    "parse_command",
    "run",
]
