"""The registry of optimizations: one ``Recipe`` per optimization (finding id, Overrides field, snippet,
train switch, bench rows, profile probe, fix --apply hook), declared by the module that holds it
(``pitstop.recipes.entries.entry``) and ordered by ``pitstop.recipes.registry.MODULES``. An
optimization that is one component (``pitstop.recipes.component``) has its own module here
(``channels_last``, ``autocast``, ``optimizer_impl``, ``tf32``, ``cudnn_benchmark``, ``float32``,
``compile``; the training loop's own: ``step``, ``host_memory``, ``activation_checkpointing``;
``dataloader`` holds three, the DataLoader's keywords), which its entry names; each declares the surface
it acts on (the model, the forward, the optimizer, the process, the model's dtype, the model's call
wrapped, the loader; the step loop, the host's allocator, recomputed blocks), and ``components(surface)``
lists those of one. ``pitstop.recipes.knobs.Knobs`` is the
one record of the optimization settings, each recipe's ``override`` the name of its knob there."""

from pitstop.recipes.registry import (
    BY_FINDING,
    BY_NAME,
    RECIPES,
    Recipe,
    bench_title,
    by_finding,
    by_name,
    component,
    components,
    enabled,
    finding_kinds,
    fix_kinds,
    loader_components,
    model_components,
    recipe,
)

__all__ = [
    "BY_FINDING",
    "BY_NAME",
    "RECIPES",
    "Recipe",
    "bench_title",
    "by_finding",
    "by_name",
    "component",
    "components",
    "enabled",
    "finding_kinds",
    "fix_kinds",
    "loader_components",
    "model_components",
    "recipe",
]
