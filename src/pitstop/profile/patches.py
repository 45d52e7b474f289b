"""Undoable patches of torch's classes and modules, and torch's CUDA sync debug mode as a counter."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable
from typing import Any

import torch

CUDA_SYNC_WARNING = ".*synchronizing CUDA operation.*"


class Patches:
    """Attributes replaced on torch's classes and modules, and hook handles; ``undo`` restores all."""

    def __init__(self) -> None:
        self._undo: list[tuple[Any, str, bool, Any]] = []
        self._handles: list[Any] = []

    def patch(self, owner: Any, name: str, new: Any) -> None:
        had = name in owner.__dict__
        self._undo.append((owner, name, had, owner.__dict__.get(name)))
        setattr(owner, name, new)

    def handle(self, h: Any) -> None:
        self._handles.append(h)

    @property
    def handles(self) -> list[Any]:
        return list(self._handles)

    def undo(self, keep_handles: bool = False) -> None:
        """Restore the patched attributes and remove the hooks (``keep_handles``: the hooks stay, for a
        later ``undo``)."""
        for owner, name, had, old in reversed(self._undo):
            if had:
                setattr(owner, name, old)
            else:
                with contextlib.suppress(AttributeError):
                    delattr(owner, name)
        self._undo.clear()
        if keep_handles:
            return
        for h in self._handles:
            h.remove()
        self._handles.clear()


def _inert(*args: Any, **kwargs: Any) -> None:
    return None


def make_inert(handles: list[Any]) -> None:
    """The hooks behind ``handles`` (``RemovableHandle``) become no-ops under the same keys: torch may be
    iterating the dict that holds them (a hook that stops measuring runs inside that loop), so removing
    them must wait."""
    for h in handles:
        hooks = h.hooks_dict_ref()
        if hooks is not None and h.id in hooks:
            hooks[h.id] = _inert


def install_cuda_sync_debug(on_sync: Callable[[], None], patches: Patches, undo: list[Any]) -> None:
    """CUDA syncs the sync wrappers cannot see (inside torch calls): ``set_sync_debug_mode("warn")``
    makes torch warn on each; ``on_sync`` is called for each such warning instead of showing it. Call
    only once the script itself has initialised CUDA: a CPU-only script must not pay for that."""
    try:
        torch.cuda.set_sync_debug_mode("warn")
    except Exception:
        return
    warnings.filterwarnings("always", message=CUDA_SYNC_WARNING)
    orig_show = warnings.showwarning

    def showwarning(
        message: Any, category: Any, filename: str, lineno: int, *args: Any, **kwargs: Any
    ) -> None:
        if "synchronizing CUDA operation" in str(message):
            on_sync()
            return None
        return orig_show(message, category, filename, lineno, *args, **kwargs)

    patches.patch(warnings, "showwarning", showwarning)

    def restore() -> None:
        with contextlib.suppress(Exception):
            torch.cuda.set_sync_debug_mode(0)
        warnings.filters[:] = [
            f for f in warnings.filters if getattr(f[1], "pattern", None) != CUDA_SYNC_WARNING
        ]

    undo.append(restore)
