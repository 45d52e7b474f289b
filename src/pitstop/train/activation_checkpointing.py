"""Activation checkpointing: drop chosen submodules' activations in the forward, recompute in backward.

Trades one extra forward of those blocks for their activation memory. Non-reentrant
``torch.utils.checkpoint`` (the recommended mode: works with kwargs, ``torch.compile`` and
inputs that do not require grad). The module tree and ``state_dict`` keys stay unchanged: only the
instance's ``forward`` is wrapped, so checkpoints load with or without it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from pitstop.train.memory import peak_memory_bytes

Target = str | type[torch.nn.Module] | Callable[[str, torch.nn.Module], bool]
_MARK = "_pitstop_ckpt_forward"


def _matches(name: str, module: torch.nn.Module, targets: Iterable[Target]) -> bool:
    for t in targets:
        if isinstance(t, str):
            if name == t:
                return True
        elif isinstance(t, type):
            if isinstance(module, t):
                return True
        elif t(name, module):
            return True
    return False


def apply_activation_checkpointing(model: torch.nn.Module, targets: Iterable[Target]) -> list[str]:
    """Checkpoint every submodule matching ``targets``: qualified names (``"layers.0"``), module types
    (``nn.TransformerEncoderLayer``) or a predicate ``(name, module) -> bool``. Returns the names wrapped.

    Nested matches are skipped (checkpointing inside a checkpointed block only recomputes twice).
    Raises ValueError when nothing matched, so a typo does not silently disable the saving.
    """
    targets = list(targets)
    wrapped: list[str] = []
    for name, module in model.named_modules():
        if not name or not _matches(name, module, targets):
            continue
        if any(name.startswith(w + ".") for w in wrapped) or hasattr(module, _MARK):
            continue
        orig = module.forward

        @functools.wraps(orig)
        def forward(*args: Any, _orig: Callable[..., Any] = orig, **kwargs: Any) -> Any:
            if not torch.is_grad_enabled():  # eval / no_grad: nothing to save, nothing to recompute
                return _orig(*args, **kwargs)
            return checkpoint(_orig, *args, use_reentrant=False, **kwargs)

        setattr(module, _MARK, orig)
        module.forward = forward  # type: ignore[method-assign]
        wrapped.append(name)
    if not wrapped:
        raise ValueError(f"activation checkpointing: no submodule matched {targets!r}")
    return wrapped


def remove_activation_checkpointing(model: torch.nn.Module) -> int:
    """Undo ``apply_activation_checkpointing``; returns how many modules were restored."""
    n = 0
    for module in model.modules():
        if hasattr(module, _MARK):
            module.forward = getattr(module, _MARK)  # type: ignore[method-assign]
            delattr(module, _MARK)
            n += 1
    return n


def measure_step_memory(
    model: torch.nn.Module,
    batch: Any,
    loss_fn: Callable[[torch.nn.Module, Any], torch.Tensor],
    device: torch.device | str = "cpu",
) -> int:
    """Peak tensor bytes of one forward+backward (beyond the parameters), gradients cleared after."""

    def step() -> None:
        loss_fn(model, batch).backward()

    params = list(model.parameters())
    try:
        return peak_memory_bytes(step, device, preexisting=params)
    finally:
        model.zero_grad(set_to_none=True)


def activation_memory_saving(
    model: torch.nn.Module,
    targets: Iterable[Target],
    batch: Any,
    loss_fn: Callable[[torch.nn.Module, Any], torch.Tensor],
    device: torch.device | str = "cpu",
) -> tuple[int, int]:
    """Measured peak step memory ``(without, with)`` checkpointing ``targets``; the model is left unwrapped."""
    already = remove_activation_checkpointing(model)
    if already:
        raise ValueError("model already has activation checkpointing applied; remove it first")
    without = measure_step_memory(model, batch, loss_fn, device)
    apply_activation_checkpointing(model, targets)
    try:
        with_ckpt = measure_step_memory(model, batch, loss_fn, device)
    finally:
        remove_activation_checkpointing(model)
    return without, with_ckpt
