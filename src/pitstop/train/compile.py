"""``torch.compile`` as an opt-in with a fallback: a model that fails to compile still trains, eagerly.

Compilation is lazy (it happens on the first call), so failures surface at the first forward, not at
``torch.compile``; the wrapper catches them there, warns once and switches to the eager module.
"""

from __future__ import annotations

import logging
import warnings
from typing import Any

import torch

log = logging.getLogger(__name__)


class CompiledWithFallback(torch.nn.Module):
    """Calls the compiled module; on a compile/backend error, warns and uses the eager one from then on.

    Registered as a wrapper module whose only child is the original (so ``state_dict`` keys gain a
    ``module.`` prefix, like DDP); use ``.module`` to get the plain model back for saving.
    """

    def __init__(self, module: torch.nn.Module, **compile_kwargs: Any) -> None:
        super().__init__()
        self.module = module
        self._compiled = torch.compile(module, **compile_kwargs)
        self.failed: BaseException | None = None

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if self.failed is None:
            try:
                return self._compiled(*args, **kwargs)
            except Exception as exc:  # backend/inductor/dynamo errors have no common base class
                if not _is_compile_error(exc):
                    raise
                self.failed = exc
                warnings.warn(
                    f"torch.compile failed ({type(exc).__name__}: {str(exc).splitlines()[0][:200]}); "
                    "training continues eagerly",
                    RuntimeWarning,
                    stacklevel=2,
                )
        return self.module(*args, **kwargs)


def _is_compile_error(exc: BaseException) -> bool:
    mod = type(exc).__module__ or ""
    if mod.startswith(("torch._dynamo", "torch._inductor", "torch.fx", "torch._subclasses")):
        return True
    # Missing C compiler / Triton and similar environment problems arrive as plain errors from inductor.
    return isinstance(exc, (OSError, ImportError, NotImplementedError)) or "inductor" in str(exc).lower()


def maybe_compile(model: torch.nn.Module, enabled: bool = True, **compile_kwargs: Any) -> torch.nn.Module:
    """``torch.compile(model)`` behind a fallback to eager, or ``model`` itself when disabled/unavailable."""
    if not enabled:
        return model
    if not hasattr(torch, "compile"):
        warnings.warn(
            "torch.compile is not available in this torch; training eagerly", RuntimeWarning, stacklevel=2
        )
        return model
    try:
        return CompiledWithFallback(model, **compile_kwargs)
    except Exception as exc:  # e.g. an unknown backend name fails eagerly
        warnings.warn(f"torch.compile unavailable ({exc}); training eagerly", RuntimeWarning, stacklevel=2)
        return model


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The user's model under compile/DDP/DataParallel wrappers, for saving and attribute access.

    Only known wrappers are removed: a user's own module with a ``module`` attribute stays as it is.
    """
    from torch.nn.parallel import DataParallel, DistributedDataParallel

    while True:
        if isinstance(model, (CompiledWithFallback, DistributedDataParallel, DataParallel)):
            model = model.module
        elif isinstance(getattr(model, "_orig_mod", None), torch.nn.Module):  # torch.compile's wrapper
            model = model._orig_mod  # type: ignore[assignment]
        else:
            return model
