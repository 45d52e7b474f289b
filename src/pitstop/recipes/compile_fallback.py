"""The module ``torch.compile``'s component (``pitstop.recipes.compile``) wraps a model in for
``pitstop.train`` and ``pitstop bench``: the compiled model behind a fallback, so a model that fails to
compile still trains, eagerly. Apart from the component because it imports torch (the registry reads the
component without it).

Compilation is lazy (it happens on the first call), so failures surface at the first forward, not at
``torch.compile``; the wrapper catches them there, warns once and switches to the eager module.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch


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
                if not is_compile_error(exc):
                    raise
                self.failed = exc
                warnings.warn(
                    f"torch.compile failed ({type(exc).__name__}: {str(exc).splitlines()[0][:200]}); "
                    "training continues eagerly",
                    RuntimeWarning,
                    stacklevel=2,
                )
        return self.module(*args, **kwargs)


def is_compile_error(exc: BaseException) -> bool:
    """Whether ``exc`` came from compiling (dynamo, inductor, fx, a missing compiler), not the model."""
    mod = type(exc).__module__ or ""
    if mod.startswith(("torch._dynamo", "torch._inductor", "torch.fx", "torch._subclasses")):
        return True
    # Missing C compiler / Triton and similar environment problems arrive as plain errors from inductor.
    return isinstance(exc, (OSError, ImportError, NotImplementedError)) or "inductor" in str(exc).lower()
