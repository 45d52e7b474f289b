"""The registry of optimizations: one ``Recipe`` per optimization (finding id, Overrides field, snippet,
train switch, bench rows, profile probe, fix --apply hook). See ``pitstop.recipes.registry``. An
optimization that is one component (``pitstop.recipes.component``) has its own module here
(``channels_last``), which its entry names."""

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
    "recipe",
]
