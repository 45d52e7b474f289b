"""``Recipe``, one optimization's registry entry, and ``entry``, which builds a component's entry from its
own constants. A component module declares its entry itself (``RECIPE = entry(__name__, title=...)``,
several as ``RECIPES``); ``pitstop.recipes.registry`` lists the modules in registry order. Both import
this module and it imports none of them, so there is no import cycle.

References to code elsewhere are by name (a dotted path, a dataclass field, a probe result key), so this
module imports neither torch nor the packages that read it.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass


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


def entry(
    module: str,
    record: str | None = None,
    *,
    title: str,
    train: str | None = None,
    bench: tuple[tuple[str, str], ...] = (),
    bench_knob: str | None = None,
    apply: str | None = None,
    fix: bool = True,
    untimed: bool = False,
    site: str | None = None,
) -> Recipe:
    """The entry of the component ``module`` (its name: the module declaring its entry passes
    ``__name__``, below the constants read here), or of the component ``record``, one of several records
    the module holds. ``name``, ``snippet``, ``finding``, ``also``, ``override`` and ``probe`` are the
    component's ``NAME``, ``SNIPPET``, ``FINDING``, ``ALSO`` (if any), ``KNOB`` and ``PROBE`` (if any);
    ``component`` names it; the keywords give the rest (``Recipe``)."""
    # a module is in sys.modules while its body runs, so it can pass itself by name
    found = sys.modules[module]
    comp = getattr(found, record) if record else found
    return Recipe(
        comp.NAME,
        title,
        comp.SNIPPET,
        finding=comp.FINDING,
        also=getattr(comp, "ALSO", ()),
        override=comp.KNOB,
        train=train,
        bench=bench,
        bench_knob=bench_knob,
        probe=getattr(comp, "PROBE", None),
        apply=apply,
        fix=fix,
        untimed=untimed,
        site=site,
        component=f"{module}:{record}" if record else module,
    )
