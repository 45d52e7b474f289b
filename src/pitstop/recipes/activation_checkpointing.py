"""Activation checkpointing: drop chosen submodules' activations in the forward, recompute in backward.

Trades one extra forward of those blocks for their activation memory. Non-reentrant
``torch.utils.checkpoint`` (the recommended mode: works with kwargs, ``torch.compile`` and
inputs that do not require grad). The module tree and ``state_dict`` keys stay unchanged: only the
instance's ``forward`` is wrapped, so checkpoints load with or without it.

One component (``pitstop.recipes.component``, ``SURFACE`` ``BLOCKS``), with no knob of its own: it names
the blocks, which a ``Knobs`` bool cannot. Which command calls which part:

- ``pitstop.train`` (``TrainConfig.activation_checkpointing``: the targets) and bench's ``checkpoint``
  row (``BenchConfig.checkpoint``, ``pitstop.bench.session``): ``apply_activation_checkpointing``;
- ``pitstop.train.activation_memory_saving`` (``pitstop.train.memory``): ``apply_activation_checkpointing``
  and ``remove_activation_checkpointing`` around its two measurements;
- a finding's code: ``SNIPPET``.

torch is imported only inside the functions that touch modules, so the registry reads this without torch.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, TypeAlias

from pitstop.recipes.component import BLOCKS
from pitstop.recipes.entries import entry

if TYPE_CHECKING:
    import torch

NAME = "activation_checkpointing"
KNOB = None  # the targets are ``TrainConfig.activation_checkpointing`` (bench: ``BenchConfig.checkpoint``)
SURFACE = BLOCKS
FINDING = None  # no profile rule recommends it yet
SNIPPET = (
    "from pitstop.train import apply_activation_checkpointing\n"
    "apply_activation_checkpointing(model, [Block])  # Block: the repeated layer class"
)

# a qualified name, a module type or a predicate (a string: the alias needs no torch at run time)
Target: TypeAlias = "str | type[torch.nn.Module] | Callable[[str, torch.nn.Module], bool]"
_MARK = "_pitstop_ckpt_forward"

# its registry entry: name, snippet, finding, knob and probe are the constants above
RECIPE = entry(
    __name__,
    title="activation checkpointing",
    train="TrainConfig.activation_checkpointing",
    bench=(("checkpoint", "activation checkpointing"),),
    bench_knob="checkpoint",
    site="model",
)


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
    import torch
    from torch.utils.checkpoint import checkpoint

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
