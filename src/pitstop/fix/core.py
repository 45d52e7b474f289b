"""`pitstop fix`: prove each suggested fix by re-running the user's script with it injected.

This module holds the candidates: each ``pitstop.recipes`` entry with an ``Overrides`` field is a
candidate kind, picked by the profile finding the entry names (dataloader.workers -> num_workers values
+ persistent_workers, precision.amp -> autocast, compile.none -> torch.compile, ...) or by
``--candidates``; ``build_candidates`` turns them into Overrides for this script and machine (the
``BUILDERS`` entry of a kind, or one switch that turns the entry's override on). The rest of fix lives
beside it: ``runs`` (profile, rounds of child runs, second round, combination), ``judge`` (runs ->
verdicts through ``pitstop.measure``), ``report`` (findings, report, HTML) and ``apply`` (patches for
every fix with a code location); ``pitstop.fix`` serves their public names.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, cast

from pitstop.cliutil import comma_list
from pitstop.findings import Finding, Severity
from pitstop.fix import dist
from pitstop.fix.candidate import Candidate
from pitstop.fix.judge import Measured, judge
from pitstop.fix.patch import Patch
from pitstop.host.cpu import usable_cores
from pitstop.host.precision import device_type
from pitstop.measure import Interval
from pitstop.profile.analyze.rulekit import WARN_SHARE
from pitstop.profile.record.overrides import Overrides
from pitstop.recipes import (
    autocast,
    by_finding,
    component,
    components,
    finding_kinds,
    fix_kinds,
    loader_components,
    model_components,
    optimizer_impl,
    recipe,
)
from pitstop.recipes.component import PROCESS, WRAP
from pitstop.recipes.workers import WorkerMachine

if TYPE_CHECKING:
    from pitstop.recipes.component import (
        LoaderComponent,
        ModelComponent,
        ProcessComponent,
        WrapComponent,
    )

KINDS = fix_kinds()  # every candidate kind, in registry order
FINDING_KINDS = finding_kinds()  # finding id from profile -> candidate kind
LOADER_KINDS = frozenset(c.NAME for c in loader_components())  # the DataLoader keywords


def parse_candidates(text: str) -> tuple[str, ...] | None:
    """'auto' -> None (from the profile); 'all' -> every kind; else a validated comma list."""
    t = text.strip().lower()
    if t in ("", "auto"):
        return None
    kinds = fix_kinds()
    if t == "all":
        return kinds
    names = comma_list(t)
    bad = [n for n in names if n not in kinds]
    if bad:
        raise ValueError(f"unknown candidate(s) {', '.join(bad)}; choose from {', '.join(kinds)}")
    return names


@dataclass
class FixConfig:
    steps: int | None = None  # timed steps per run; None: from the start-up (runs.steps_from_run)
    warmup: int = 5  # steps per run before the measured ones
    budget: float = 300.0  # seconds for the whole of fix: profile run, every round, the combination
    min_rounds: int = 3  # rounds before any verdict
    max_rounds: int = 40  # a cap per stage; the budget ends the rounds first
    candidates: tuple[str, ...] | None = None  # None: chosen from the profile's findings
    skip: tuple[str, ...] = ()  # kinds never tried (e.g. "compile": minutes per run on a big model)
    min_gain: float = 0.05
    loss_rtol: float = 0.1
    timeout: float | None = 600.0
    workers_values: tuple[int, ...] | None = None  # default: recipes.workers' count and its cap
    threads_values: tuple[int, ...] | None = None  # default: the profile's fit and usable cores / ranks
    cwd: str | None = None
    env: dict[str, str] = field(default_factory=dict)


@dataclass
class FixResult:
    command: list[str]
    baseline: Measured
    candidates: list[Measured] = field(default_factory=list)
    combined: Measured | None = None
    final_single: Measured | None = None  # the best single fix, re-run in the combination's round
    chosen: list[str] = field(default_factory=list)  # names of the fixes recommended together
    speedup: float | None = None  # of the recommendation over the baseline
    interval: Interval | None = None  # of that speed-up (None: measured on top of a loader fix only)
    patch: Patch | None = None  # the DataLoader diff alone
    patches: list[Patch] = field(default_factory=list)  # every file's diff for the chosen fixes (--apply)
    unplaced: list[str] = field(default_factory=list)  # chosen fixes with no code location found, and why
    patch_error: str | None = None
    profile_findings: list[Finding] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)  # baseline run's config (locations)
    run_data: dict[str, Any] = field(default_factory=dict)  # baseline run's data (other load, ranks)
    baseline_error: str | None = None
    interrupted: bool = False
    skipped_candidates: list[str] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)  # the FixConfig it ran with

    @property
    def baseline_steps(self) -> bool:
        return bool(self.baseline.steps_per_s)


# ------------------------------------------------------------------------------------------ candidates


def loader_of(config: dict[str, Any]) -> dict[str, Any]:
    loaders = (
        [ld for ld in config.get("loaders") or [] if ld.get("batches_seen")] or config.get("loaders") or []
    )
    return max(loaders, key=lambda ld: ld.get("wait_s") or 0.0) if loaders else {}


@dataclass
class _Script:
    """What the baseline run recorded that the candidates are built from."""

    config: dict[str, Any]
    cfg: FixConfig
    dev: str
    loader: dict[str, Any]
    models: list[dict[str, Any]]
    machine: WorkerMachine
    data: dict[str, Any] = field(default_factory=dict)  # the baseline run's data (its probes, torch facts)
    findings: dict[str, dict[str, Any]] = field(default_factory=dict)  # the profile's, id -> data

    @property
    def torch(self) -> dict[str, Any]:
        """Its torch settings at the end of the baseline run (``facts.torch_facts``)."""
        return self.data.get("torch") or {}


Built = list[Candidate] | str  # the candidates, or why the kind was skipped


def _loader(s: _Script, kind: str, why: str) -> Built:
    """A DataLoader keyword's candidates (``pitstop.recipes.dataloader``: its ``candidates`` for the
    recorded loader on this machine; the worker counts ``FixConfig.workers_values`` where given)."""
    comp = cast("LoaderComponent", component(kind))
    made = comp.candidates(s.loader, s.machine, s.cfg.workers_values)
    if isinstance(made, str):
        return made
    return [Candidate(name, kind, Overrides(dataloader=forced), why) for name, forced in made]


def _amp(s: _Script, kind: str, why: str) -> Built:
    """The autocast component's dtype for this device (``choose``), unless the script autocasts already."""
    why_not = autocast.cannot_help(s.models)
    if why_not:
        return why_not
    dtype = autocast.choose(s.dev, requested=why == "requested")
    if dtype not in autocast.DTYPES:
        return dtype  # why none
    return [Candidate(f"autocast {dtype}", kind, Overrides.setting(autocast.KNOB, dtype), why)]


def _component(s: _Script, kind: str, why: str) -> Built:
    """A model component's switch (``pitstop.recipes.component``), with why it cannot help, if it says so."""
    r, comp = recipe(kind), component(kind)
    why_not = cast("ModelComponent", comp).cannot_help(s.models) if comp else None
    return [Candidate(kind, kind, Overrides.setting(r.override, True), why, why_not)]


def _foreach(s: _Script, kind: str, why: str) -> Built:
    why_not = optimizer_impl.cannot_help(s.config.get("optimizers") or [])
    if why_not:
        return why_not
    impl = optimizer_impl.choose(s.dev)
    return [Candidate(f"optimizer {impl}", kind, Overrides.setting(optimizer_impl.KNOB, impl), why)]


def _process(s: _Script, kind: str, why: str) -> Built:
    """A process-wide setting's switch (tf32, cudnn_benchmark), named ``CANDIDATE``, or why it has nothing
    to change in this run (its component's ``cannot_help``: e.g. no CUDA device)."""
    comp = cast("ProcessComponent", component(kind))
    why_not = comp.cannot_help(s.dev, s.torch)
    if why_not:
        return why_not
    return [Candidate(comp.CANDIDATE, kind, Overrides.setting(comp.KNOB, True), why)]


def _wrap(s: _Script, kind: str, why: str) -> Built:
    """A wrapper of the model's call (compile): one candidate, named ``CANDIDATE``, that turns it on."""
    comp = cast("WrapComponent", component(kind))
    return [Candidate(comp.CANDIDATE, kind, Overrides.setting(comp.KNOB, True), why)]


def _host_memory(s: _Script, kind: str, why: str) -> Built:
    if s.config.get("host_memory"):
        return f"host_memory: the script already called keep_host_memory ({s.config['host_memory']})"
    if s.dev != "cpu" and why != "requested":
        return f"host_memory: the model trains on {s.dev}; host page faults matter for CPU steps"
    return [Candidate("keep host memory", kind, Overrides(keep_host_memory=True), why)]


def _distributed(s: _Script, kind: str, why: str) -> Built:  # the ranks of a launcher (pitstop.fix.dist)
    made, why_not = dist.candidates(kind, why, s.config)
    return made or why_not or f"{kind}: nothing to try"


def _threads(s: _Script, kind: str, why: str) -> Built:
    """The thread counts to time (``dist.thread_candidates``): the one the profile's finding ``why``
    found to fit, where it names one; ``FixConfig.threads_values`` replaces them."""
    fit = (s.findings.get(why) or {}).get("fit")
    made, why_not = dist.thread_candidates(
        why, s.config, s.data, int(fit) if fit else None, s.cfg.threads_values
    )
    return made or why_not or f"{kind}: nothing to try"


def _switch(s: _Script, kind: str, why: str) -> Built:
    """A recipe whose override is a plain switch: one candidate that turns it on."""
    r = recipe(kind)
    return [Candidate(r.title, kind, Overrides.setting(r.override, True), why)]


# candidate kind -> how its candidates are built; a recipe without an entry here is a plain switch
BUILDERS = {
    **{c.NAME: _loader for c in loader_components()},
    "amp": _amp,
    **{c.NAME: _component for c in model_components()},
    "foreach": _foreach,
    **{c.NAME: _process for c in components(PROCESS)},
    **{c.NAME: _wrap for c in components(WRAP)},
    "host_memory": _host_memory,
    **{k: _distributed for k in dist.KINDS if k != "threads"},
    "threads": _threads,
}


def build_candidates(
    kinds: list[tuple[str, str]],
    config: dict[str, Any],
    cfg: FixConfig,
    data: dict[str, Any] | None = None,
    findings: list[Finding] | None = None,
) -> tuple[list[Candidate], list[str]]:
    """(kind, why) pairs -> concrete Overrides for this script and machine; plus kinds skipped and why.
    ``data``: the baseline run's data (its measured other load and ranks decide the worker count);
    ``findings``: the profile's (the thread count a contention finding found to fit)."""
    loader = loader_of(config)
    script = _Script(
        config,
        cfg,
        device_type(config.get("device")),
        loader,
        config.get("models") or [],
        WorkerMachine.of_run(data, usable_cores()),
        data or {},
        {f.id: f.data for f in findings or []},
    )
    out: list[Candidate] = []
    skipped: list[str] = []
    for kind, why in kinds:
        built = BUILDERS.get(kind, _switch)(script, kind, why)
        if isinstance(built, str):
            skipped.append(built)
        else:
            out += built
    return out, skipped


def kinds_from_findings(findings: list[Finding]) -> list[tuple[str, str]]:
    """Actionable findings -> candidate kinds, in rank order: warnings and errors, and the info findings
    whose gain the profile could not time in-process (compile.none always; host.page_faults when unprobed,
    or when its point estimate reached a warning's share but its interval did not confirm it: only the
    whole script, timed by fix, can tell)."""
    seen: dict[str, str] = {}
    kinds = finding_kinds()
    for f in sorted(findings, key=lambda f: (-f.severity.rank, -(f.est_saving_s or 0.0))):
        kind = kinds.get(f.id)
        if kind is None or kind in seen:
            continue
        untimed = (r := by_finding(f.id)) is not None and r.untimed
        unconfirmed = f.data.get("confirmed") is False and (f.share or 0.0) >= WARN_SHARE
        if f.severity in (Severity.WARN, Severity.ERROR) or (
            untimed and f.severity is Severity.INFO and (f.est_saving_s is None or unconfirmed)
        ):
            seen[kind] = f.id
    if "workers" in seen:
        seen.pop("persistent_workers", None)  # the workers candidates already make them persistent
    return list(seen.items())


def hidden_kinds(findings: list[Finding], taken: list[str]) -> list[tuple[str, str]]:
    """Compute fixes the profile measured a gain for (a probe's saving) that was too small a share of the
    step to try first: candidates for the second round, once a loader fix removed the data wait."""
    out: dict[str, str] = {}
    kinds = finding_kinds()
    for f in findings:
        kind = kinds.get(f.id)
        if (
            kind
            and kind not in taken
            and kind not in LOADER_KINDS
            and kind not in out
            and f.severity is Severity.INFO
            and (f.est_saving_s or 0.0) > 0
        ):
            out[kind] = f.id
    return list(out.items())


def merge(overrides: list[Overrides]) -> Overrides:
    """All of them at once (each field: the first that sets it; DataLoader keywords: the last wins)."""
    loader: dict[str, Any] = {}
    chosen: dict[str, Any] = {}
    for o in overrides:
        loader.update(o.dataloader)
        for f in fields(Overrides):
            if f.name != "dataloader":
                chosen[f.name] = chosen.get(f.name) or getattr(o, f.name)
    return Overrides(dataloader=loader, **chosen)


__all__ = [
    "KINDS",
    "LOADER_KINDS",
    "FixConfig",
    "FixResult",
    "Measured",
    "Patch",
    "build_candidates",
    "judge",
    "kinds_from_findings",
    "loader_of",
    "merge",
    "parse_candidates",
]
