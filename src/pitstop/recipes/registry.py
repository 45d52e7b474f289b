"""The registry of optimizations: one ``Recipe`` (``pitstop.recipes.entries``) per optimization: the
finding that recommends it, the ``Overrides`` field that injects it into an unmodified script, the code
change, how ``pitstop.train`` turns it on, the bench rows that ablate it, the profile probe that measures it
and the ``fix --apply`` hook that writes it.

Each component module declares its own entries (``RECIPE``, or ``RECIPES`` where it holds several), built
by ``entries.entry`` from its constants; this module only orders the modules (``MODULES``) and answers the
lookups. References to code elsewhere are by name, so this module imports neither torch nor the packages
that read it.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import TYPE_CHECKING, cast

from pitstop.recipes import (
    activation_checkpointing,
    autocast,
    channels_last,
    cudnn_benchmark,
    dataloader,
    float32,
    host_memory,
    optimizer_impl,
    step,
    tf32,
    threads,
)
from pitstop.recipes import compile as torch_compile
from pitstop.recipes.component import LOADER, MODEL, SURFACES
from pitstop.recipes.entries import Recipe

if TYPE_CHECKING:
    from pitstop.recipes.component import Component, LoaderComponent, ModelComponent

# The modules that declare entries, in registry order: ``pitstop fix``'s candidate order, the bench rows,
# the docs' tables and ``components()`` follow it. A new optimization is one line here (and its import).
MODULES: tuple[ModuleType, ...] = (
    dataloader,  # workers, persistent_workers, pin_memory
    autocast,
    float32,
    channels_last,
    optimizer_impl,
    torch_compile,
    cudnn_benchmark,
    host_memory,
    tf32,
    activation_checkpointing,
    step,  # accumulation, no_sync, static_graph
    threads,
)


def declared(module: ModuleType) -> tuple[Recipe, ...]:
    """The entries ``module`` declares: its ``RECIPES`` (several, in order), else its ``RECIPE``."""
    if hasattr(module, "RECIPES"):
        return tuple(module.RECIPES)
    return (module.RECIPE,)


RECIPES: tuple[Recipe, ...] = tuple(r for m in MODULES for r in declared(m))

BY_NAME = {r.name: r for r in RECIPES}
BY_FINDING = {fid: r for r in RECIPES for fid in r.findings}


def by_name(name: str) -> Recipe | None:
    """The entry called ``name``, if any (read at call time, so an entry added in a test is seen)."""
    return next((r for r in RECIPES if r.name == name), None)


def recipe(name: str) -> Recipe:
    """The entry called ``name``; KeyError names the known ones."""
    r = by_name(name)
    if r is None:
        raise KeyError(f"no recipe {name!r}; known: {', '.join(r.name for r in RECIPES)}")
    return r


def fix_kinds() -> tuple[str, ...]:
    """The candidate kinds ``pitstop fix`` can time, in registry order."""
    return tuple(r.name for r in RECIPES if r.fix and r.override)


def finding_kinds() -> dict[str, str]:
    """Finding id -> the fix candidate kind that acts on it (each of an entry's ``findings``)."""
    return {fid: r.name for r in RECIPES if r.fix and r.override for fid in r.findings}


def by_finding(finding_id: str) -> Recipe | None:
    """The entry that acts on the finding ``finding_id`` (its ``finding`` or one of ``also``), if any."""
    return next((r for r in RECIPES if finding_id in r.findings), None)


def bench_title(row: str) -> str:
    """The title of the bench row ``row`` (one that ablates a single optimization)."""
    for r in RECIPES:
        for name, title in r.bench:
            if name == row:
                return title
    raise KeyError(f"no recipe has a bench row {row!r}")


def _load(ref: str) -> Component:
    """The component an entry names: a module, or ``module:NAME``, one record of several in a module."""
    module, _, attr = ref.partition(":")
    found = importlib.import_module(module)
    return cast("Component", getattr(found, attr) if attr else found)


def component(name: str) -> Component | None:
    """The component of the entry called ``name`` (``pitstop.recipes.component``), if it has one."""
    r = by_name(name)
    return _load(r.component) if r and r.component else None


def components(*surfaces: str) -> list[Component]:
    """Every entry's component, in registry order, that acts on one of ``surfaces`` (default
    ``pitstop.recipes.component.SURFACES``: a caller iterates the ones whose parts it calls; the training
    loop's own, ``LOOP_SURFACES``, only where named)."""
    found = [_load(r.component) for r in RECIPES if r.component]
    return [c for c in found if c.SURFACE in (surfaces or SURFACES)]


def model_components() -> list[ModelComponent]:
    """The components that change the model and its batches (``MODEL``), in registry order."""
    return cast("list[ModelComponent]", components(MODEL))


def loader_components() -> list[LoaderComponent]:
    """The components that are a DataLoader keyword (``LOADER``), in registry order: num_workers first."""
    return cast("list[LoaderComponent]", components(LOADER))


def enabled(knobs: object) -> list[ModelComponent]:
    """The model components whose knob (``KNOB``) is on in ``knobs`` (a ``pitstop.recipes.knobs.Knobs``
    or a record built on it), in registry order: what train, bench and profile's injection apply to the
    model and its batches (the other surfaces are applied where they act: the forward's context, the
    optimizer's constructor)."""
    return [c for c in model_components() if getattr(knobs, c.KNOB, False)]
