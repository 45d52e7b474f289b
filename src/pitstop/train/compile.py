"""``torch.compile`` as an opt-in with a fallback: a model that fails to compile still trains, eagerly.
The compile component's (``pitstop.recipes.compile``) ``wrap`` and its wrapper, served here under the names
scripts use; ``unwrap`` removes it and the other wrappers pitstop.train adds.

Compilation is lazy (it happens on the first call), so failures surface at the first forward, not at
``torch.compile``; the wrapper catches them there, warns once and switches to the eager module.
"""

from __future__ import annotations

from typing import Any

import torch

from pitstop.recipes import compile as torch_compile
from pitstop.recipes.compile_fallback import CompiledWithFallback


def maybe_compile(model: torch.nn.Module, enabled: bool = True, **compile_kwargs: Any) -> torch.nn.Module:
    """``torch.compile(model)`` behind a fallback to eager, or ``model`` itself when disabled/unavailable."""
    return torch_compile.wrap(model, **compile_kwargs) if enabled else model


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The user's model under compile/DDP/DataParallel wrappers, for saving and attribute access.

    Only known wrappers are removed: a user's own module with a ``module`` attribute stays as it is.
    """
    from torch.nn.parallel import DataParallel, DistributedDataParallel

    while True:
        if isinstance(model, (DistributedDataParallel, DataParallel)):
            model = model.module
        elif (inner := torch_compile.inner(model)) is not None:  # compile's wrappers
            model = inner
        else:
            return model


__all__ = ["CompiledWithFallback", "maybe_compile", "unwrap"]
