"""Undoable patches of torch's classes and modules (or any object's attributes), and hook handles removed
with them. Used by the profiler's instrumentation (``pitstop.profile``) and by ``pitstop.train``'s DDP
injection alike."""

from __future__ import annotations

import contextlib
from typing import Any


class Patches:
    """Attributes replaced on torch's classes and modules, and hook handles; ``undo`` restores all."""

    def __init__(self) -> None:
        self._undo: list[tuple[Any, str, bool, Any]] = []
        self._handles: list[Any] = []

    def patch(self, owner: Any, name: str, new: Any) -> None:
        had = name in owner.__dict__
        self._undo.append((owner, name, had, owner.__dict__.get(name)))
        setattr(owner, name, new)

    def set_value(self, owner: Any, name: str, new: Any) -> None:
        """``owner.name = new`` through the owner's own attribute setting, the old value set back by
        ``undo``: for an object that keeps its values outside ``__dict__`` (``torch._dynamo.config``, where
        ``patch``'s delete would hide the setting)."""
        self._undo.append((owner, name, True, getattr(owner, name)))
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
