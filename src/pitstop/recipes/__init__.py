"""The registry of optimizations: one ``Recipe`` per optimization (finding id, Overrides field, snippet,
train switch, bench rows, profile probe, fix --apply hook). See ``pitstop.recipes.registry``."""

from pitstop.recipes.registry import (
    BY_FINDING,
    BY_NAME,
    RECIPES,
    Recipe,
    bench_title,
    by_finding,
    by_name,
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
    "finding_kinds",
    "fix_kinds",
    "recipe",
]
