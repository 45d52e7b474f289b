"""DataLoader patches: ``DataLoader.__init__`` (settings as constructed, file:line, overrides applied),
``DataLoader.__iter__`` (new worker pools, first-batch latency) and ``_BaseDataLoaderIter.__next__``
(data wait, a step boundary).

Nothing is stored on the script's loaders or iterators: what pitstop knows of them sits in side tables
keyed by identity, so they pickle, copy and print as without pitstop.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import time
import weakref
from typing import TYPE_CHECKING, Any

from torch.utils.data import DataLoader
from torch.utils.data.dataloader import _BaseDataLoaderIter

from pitstop.profile.capture.where import user_location
from pitstop.profile.record.captured import CapturedLoader
from pitstop.recipes import dataloader

if TYPE_CHECKING:
    from pitstop.profile.capture.patches import Patches
    from pitstop.profile.capture.points import ProbePoints

clock = time.perf_counter
_DL_SIG = inspect.signature(DataLoader.__init__)


class LoaderTables:
    """What pitstop knows of the script's loaders and iterators, keyed by ``id``. Loaders stay alive
    (``Captured`` holds them); an iterator's entry holds a weak reference to check the id is still it."""

    def __init__(self) -> None:
        self.loaders: dict[int, CapturedLoader] = {}
        self.iterators: dict[int, tuple[weakref.ref[Any], CapturedLoader, list[bool]]] = {}
        # iterators that can own worker processes, for shutting those down; the dead are dropped as new
        # ones come (a loop makes a new iterator every epoch), so a long run does not pile them up
        self.refs: list[weakref.ref[Any]] = []
        # (iterator, its worker processes, its loader) for each iterator that started workers: the
        # Process objects outlive an iterator dropped by the exception a worker's death raised
        self.pools: list[tuple[weakref.ref[Any], list[Any], CapturedLoader]] = []
        self.in_init: set[int] = set()

    def add_iterator(self, it: Any, cap: CapturedLoader) -> None:
        ref = weakref.ref(it, lambda _r, key=id(it): self._forget(key, _r))
        self.iterators[id(it)] = (ref, cap, [True])
        if hasattr(it, "_shutdown_workers"):
            self.refs = [r for r in self.refs if r() is not None]
            self.refs.append(ref)
        workers = getattr(it, "_workers", None)
        if workers:
            self.pools.append((ref, list(workers), cap))

    def _forget(self, key: int, ref: weakref.ref[Any]) -> None:
        entry = self.iterators.get(key)
        if entry is not None and entry[0] is ref:
            del self.iterators[key]

    def of_iterator(self, it: Any) -> tuple[CapturedLoader, list[bool]] | None:
        entry = self.iterators.get(id(it))
        if entry is None or entry[0]() is not it:
            return None
        return entry[1], entry[2]


def install_loader_patches(inst: ProbePoints, patches: Patches, tables: LoaderTables) -> None:
    patches.patch(DataLoader, "__init__", _make_init(inst, tables, DataLoader.__init__))
    patches.patch(DataLoader, "__iter__", _make_iter(inst, tables, DataLoader.__iter__))
    patches.patch(_BaseDataLoaderIter, "__next__", _make_next(inst, tables, _BaseDataLoaderIter.__next__))


def _make_init(inst: ProbePoints, tables: LoaderTables, orig: Any) -> Any:
    @functools.wraps(orig)
    def __init__(self: DataLoader, *args: Any, **kwargs: Any) -> None:
        if id(self) in tables.in_init:  # a subclass calling DataLoader.__init__ again from inside it
            return orig(self, *args, **kwargs)
        try:
            bound = _DL_SIG.bind(self, *args, **kwargs)
        except TypeError:
            return orig(self, *args, **kwargs)  # let DataLoader raise its own message
        kw = dict(bound.arguments)
        kw.pop("self", None)
        kw.update(kw.pop("kwargs", {}) or {})
        applied, skipped = apply_loader_overrides(kw, inst.cfg.overrides.dataloader)
        tables.in_init.add(id(self))
        try:
            orig(self, **kw)
        finally:
            tables.in_init.discard(id(self))
        cap = CapturedLoader(
            loader=self,
            kwargs=kw,
            dataset=kw.get("dataset"),
            location=user_location(2),
            applied=applied,
            skipped=skipped,
        )
        tables.loaders[id(self)] = cap
        inst.loader_built(cap)

    return __init__


def apply_loader_overrides(
    kw: dict[str, Any], forced: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, str]]:
    """``forced`` into the loader's keywords, in place, by the loader components
    (``pitstop.recipes.dataloader.inject``); what was applied, and what was skipped and why."""
    return dataloader.inject(kw, forced)


def _make_iter(inst: ProbePoints, tables: LoaderTables, orig: Any) -> Any:
    @functools.wraps(orig)
    def __iter__(self: DataLoader) -> Any:
        it = orig(self)
        cap = tables.loaders.get(id(self))
        if cap is None:  # built before install (a trainer's loader): measured from here on
            cap = inst.adopt_loader(self, user_location(2))
        if cap is not None and isinstance(it, _BaseDataLoaderIter):
            tables.add_iterator(it, cap)
            cap.iterators += 1
        return it

    return __iter__


def _make_next(inst: ProbePoints, tables: LoaderTables, orig: Any) -> Any:
    @functools.wraps(orig)
    def __next__(self: _BaseDataLoaderIter) -> Any:
        if inst.in_next:
            return orig(self)
        t = clock()
        inst.boundary(t)
        inst.data_begin(t)
        try:
            batch = orig(self)
        finally:
            end = clock()
            inst.data_end(end)
            known = tables.of_iterator(self)
            if known is not None:
                cap, first = known
                cap.wait_s += end - t
                if first[0]:
                    first[0] = False
                    cap.first_batch_s.append(end - t)
        if known is not None:
            cap.batches += 1
        inst.batch_loaded(batch)
        return batch

    return __next__


def shutdown_loader_workers(tables: LoaderTables) -> None:
    """Stop DataLoader worker processes the stopped script left behind (a for-loop left by an exception)."""
    for ref in tables.refs:
        it = ref()
        if it is not None and hasattr(it, "_shutdown_workers"):
            with contextlib.suppress(Exception):
                it._shutdown_workers()
