"""``torch.utils.benchmark`` without the warning its import logs on a machine with no CUDA runtime.

``torch.utils.benchmark`` imports ``torch.utils.cpp_extension`` (for a C++ timer pitstop never uses), whose
import logs ``No CUDA runtime is found, using CUDA_HOME=...`` when CUDA_HOME is set or guessed but no GPU
is usable. pitstop imports it for its own timers only, so that line is muted for this one import: a user
script that imports cpp_extension itself (before pitstop does) still logs it.
"""

from __future__ import annotations

import logging
import sys
from types import ModuleType

_LOGGER = "torch.utils.cpp_extension"


def torch_benchmark() -> ModuleType:
    """The ``torch.utils.benchmark`` module, its first import run with cpp_extension's logger at ERROR."""
    if "torch.utils.benchmark" in sys.modules:
        return sys.modules["torch.utils.benchmark"]
    log = logging.getLogger(_LOGGER)
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        import torch.utils.benchmark as benchmark
    finally:
        log.setLevel(level)
    return benchmark
