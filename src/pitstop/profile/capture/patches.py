"""Hooks made inert while torch may be running them, and torch's CUDA sync debug mode as a counter. The
undoable patches themselves are ``pitstop.patching.Patches``."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable
from typing import Any

import torch

from pitstop.patching import Patches

CUDA_SYNC_WARNING = ".*synchronizing CUDA operation.*"


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


def install_cuda_sync_debug(on_sync: Callable[[], None], patches: Patches, undo: list[Any]) -> bool:
    """CUDA syncs the sync wrappers cannot see (inside torch calls): ``set_sync_debug_mode("warn")``
    makes torch warn on each; ``on_sync`` is called for each such warning instead of showing it. Call
    only once the script itself has initialised CUDA: a CPU-only script must not pay for that. False: this
    torch has no sync debug mode (nothing installed)."""
    try:
        torch.cuda.set_sync_debug_mode("warn")
    except Exception:
        return False
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
    return True
