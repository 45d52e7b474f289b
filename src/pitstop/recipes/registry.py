"""One entry per optimization pitstop knows: the finding that recommends it, the ``Overrides`` field that
injects it into an unmodified script, the code change, how ``pitstop.train`` turns it on, the bench rows
that ablate it, the profile probe that measures it and the ``fix --apply`` hook that writes it.

References to code elsewhere are by name (a dotted path, a dataclass field, a probe result key), so this
module imports neither torch nor the packages that read it.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
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

if TYPE_CHECKING:
    from pitstop.recipes.component import Component, LoaderComponent, ModelComponent

DATALOADER_PATCH = "pitstop.fix.patch.dataloader_patch"


@dataclass(frozen=True)
class Recipe:
    """One optimization.

    name:     stable key; where ``pitstop fix`` times it, its candidate kind.
    title:    a few words for tables.
    finding:  id of the profile finding that recommends it (None: no rule recommends it yet).
    also:     ids of other findings it acts on (the same fix for another cause); ``findings`` lists all.
    override: its knob: the ``pitstop.recipes.knobs.Knobs`` field that turns it on (``dataloader.<key>``
              for a DataLoader keyword); ``Overrides`` injects it, its bench rows set it.
    snippet:  the code change; ``str.format`` fields: {device} {dtype} {impl} {optimizer} {value}.
    train:    how ``pitstop.train`` enables it: ``TrainConfig.<field>`` or a dotted function name.
    bench:    (row name, row title) of each ``pitstop bench`` row that ablates it.
    bench_knob: the ``BenchConfig`` field those rows set, for an entry without a knob (``override``).
    probe:    key of ``pitstop.profile.probe.probes.run_probes``' result that measures it in the user's process.
    apply:    dotted name of the function ``fix --apply`` uses to write it into the script.
    component: dotted name of the module that holds the whole optimization (``pitstop.recipes.component``:
              its model/input change, probe, rule, snippet and edit), or ``module:NAME`` for one of several
              components a module holds (the DataLoader's keywords); the fields above then name its parts.
    fix:      whether ``pitstop fix`` times it as a candidate (it needs an ``override``).
    untimed:  its info finding means "the profile could not time this; ``pitstop fix`` measures it".
    site:     where its code change goes: "model" (after the model is built), "optimizer" (its
              constructor), "loader" (the DataLoader call); None: the top of the script.
    """

    name: str
    title: str
    snippet: str
    finding: str | None = None
    also: tuple[str, ...] = ()
    override: str | None = None
    train: str | None = None
    bench: tuple[tuple[str, str], ...] = ()
    bench_knob: str | None = None
    probe: str | None = None
    apply: str | None = None
    fix: bool = True
    untimed: bool = False
    site: str | None = None
    component: str | None = None

    @property
    def findings(self) -> tuple[str, ...]:
        """Every finding id it acts on: ``finding`` first, then ``also``."""
        return (self.finding, *self.also) if self.finding else self.also

    def code(self, **fields: object) -> str:
        """The snippet with its fields filled in."""
        return self.snippet.format(**fields)


RECIPES: tuple[Recipe, ...] = (
    Recipe(
        dataloader.WORKERS.NAME,
        "DataLoader workers",
        dataloader.WORKERS.SNIPPET,
        finding=dataloader.WORKERS.FINDING,
        override=dataloader.WORKERS.KNOB,
        bench=(("workers", "DataLoader workers"),),
        apply=DATALOADER_PATCH,
        site="loader",
        component=f"{dataloader.__name__}:WORKERS",
    ),
    Recipe(
        dataloader.PERSISTENT_WORKERS.NAME,
        "persistent workers",
        dataloader.PERSISTENT_WORKERS.SNIPPET,
        finding=dataloader.PERSISTENT_WORKERS.FINDING,
        override=dataloader.PERSISTENT_WORKERS.KNOB,
        apply=DATALOADER_PATCH,
        site="loader",
        component=f"{dataloader.__name__}:PERSISTENT_WORKERS",
    ),
    Recipe(
        dataloader.PIN_MEMORY.NAME,
        "pinned memory",
        dataloader.PIN_MEMORY.SNIPPET,
        finding=dataloader.PIN_MEMORY.FINDING,
        override=dataloader.PIN_MEMORY.KNOB,
        train="pitstop.train.prefetch.DevicePrefetcher",
        bench=(("pin_memory", "pinned memory"),),
        apply=DATALOADER_PATCH,
        fix=False,
        site="loader",
        component=f"{dataloader.__name__}:PIN_MEMORY",
    ),
    Recipe(
        autocast.NAME,
        "mixed precision (autocast)",
        autocast.SNIPPET,
        finding=autocast.FINDING,
        override=autocast.KNOB,
        train="TrainConfig.precision",
        bench=(("amp_bf16", "AMP bf16"), ("amp_fp16", "AMP fp16 + GradScaler")),
        probe=autocast.PROBE,
        apply="pitstop.fix.apply.apply_component",
        site="model",
        component=autocast.__name__,
    ),
    Recipe(
        float32.NAME,
        "float32 instead of float64",
        float32.SNIPPET,
        finding=float32.FINDING,
        override=float32.KNOB,
        train="pitstop.train.float32.float32_model",
        probe=float32.PROBE,
        apply="pitstop.fix.apply.apply_component",
        site="model",
        component=float32.__name__,
    ),
    Recipe(
        channels_last.NAME,
        "channels_last",
        channels_last.SNIPPET,
        finding=channels_last.FINDING,
        override=channels_last.KNOB,
        train="TrainConfig.channels_last",
        bench=(("channels_last", "channels_last"),),
        probe=channels_last.PROBE,
        apply="pitstop.fix.apply.apply_component",
        site="model",
        component=channels_last.__name__,
    ),
    Recipe(
        optimizer_impl.NAME,
        "foreach / fused optimizer",
        optimizer_impl.SNIPPET,
        finding=optimizer_impl.FINDING,
        override=optimizer_impl.KNOB,
        train="pitstop.train.optim.make_optimizer",
        bench=(("fused", "fused optimizer"),),
        probe=optimizer_impl.PROBE,
        apply="pitstop.fix.apply.apply_component",
        site="optimizer",
        component=optimizer_impl.__name__,
    ),
    Recipe(
        torch_compile.NAME,
        torch_compile.CANDIDATE,
        torch_compile.SNIPPET,
        finding=torch_compile.FINDING,
        override=torch_compile.KNOB,
        train="TrainConfig.compile",
        bench=((torch_compile.NAME, "torch.compile"),),
        probe=torch_compile.PROBE,
        apply="pitstop.fix.apply.apply_component",
        untimed=True,
        site="model",
        component=torch_compile.__name__,
    ),
    Recipe(
        cudnn_benchmark.NAME,
        "cuDNN autotuning",
        cudnn_benchmark.SNIPPET,
        finding=cudnn_benchmark.FINDING,
        override=cudnn_benchmark.KNOB,
        train="TrainConfig.cudnn_benchmark",
        probe=cudnn_benchmark.PROBE,
        apply="pitstop.fix.apply.apply_component",
        component=cudnn_benchmark.__name__,
    ),
    Recipe(
        host_memory.NAME,
        "keep freed host memory",
        host_memory.SNIPPET,
        finding=host_memory.FINDING,
        override=host_memory.KNOB,
        train="TrainConfig.keep_host_memory",
        probe=host_memory.PROBE,
        apply="pitstop.fix.apply.apply_keep_host_memory",
        untimed=True,
        component=host_memory.__name__,
    ),
    Recipe(
        tf32.NAME,
        "TF32 matmuls and convolutions",
        tf32.SNIPPET,
        finding=tf32.FINDING,
        override=tf32.KNOB,
        train="TrainConfig.tf32",
        bench=((tf32.NAME, "TF32 matmuls"),),
        probe=tf32.PROBE,
        apply="pitstop.fix.apply.apply_component",
        component=tf32.__name__,
    ),
    Recipe(
        activation_checkpointing.NAME,
        "activation checkpointing",
        activation_checkpointing.SNIPPET,
        train="TrainConfig.activation_checkpointing",
        bench=(("checkpoint", "activation checkpointing"),),
        bench_knob="checkpoint",
        site="model",
        component=activation_checkpointing.__name__,
    ),
    Recipe(
        step.ACCUMULATION,
        "gradient accumulation",
        step.ACCUMULATION_SNIPPET,
        train="TrainConfig.accum_steps",
        bench=(("accumulation", "gradient accumulation x4"),),
        bench_knob="accumulation",
    ),
    Recipe(
        step.NAME,
        "DDP no_sync during accumulation",
        step.SNIPPET,
        finding=step.FINDING,
        override=step.KNOB,
        train="pitstop.recipes.step.sync_context",
        apply="pitstop.fix.apply_dist.apply_no_sync",
        component=step.__name__,
    ),
    Recipe(
        step.STATIC_GRAPH,
        "DDP static_graph",
        step.STATIC_GRAPH_SNIPPET,
        finding=step.STATIC_GRAPH_FINDING,
        override=step.STATIC_GRAPH_KNOB,
        apply="pitstop.fix.apply_dist.apply_static_graph",
    ),
    Recipe(
        threads.NAME,
        "intra-op threads",
        threads.SNIPPET,
        finding=threads.FINDING,
        also=threads.ALSO,
        override=threads.KNOB,
        apply="pitstop.fix.apply.apply_component",
        component=threads.__name__,
    ),
)

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
