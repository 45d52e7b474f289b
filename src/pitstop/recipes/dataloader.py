"""The DataLoader's settings, ``num_workers``, ``persistent_workers`` and ``pin_memory``, as three
components (``pitstop.recipes.component``) whose ``SURFACE`` is the loader: one keyword of the
``DataLoader(...)`` call each. All that pitstop knows and does about them.

The three share everything but their rule and their ``pitstop fix`` candidates: the call they act on,
how a forced value is injected (``persistent_workers`` needs worker processes), what profile records of a
built loader, and the ``fix --apply`` edit (a keyword on the call). So they are one module, each a
``LoaderKeyword`` record (the components ``WORKERS``, ``PERSISTENT_WORKERS``, ``PIN_MEMORY``, which the
registry's entries name as ``pitstop.recipes.dataloader:NAME``). Which command calls which part:

- profile's injection into an unmodified script (``Knobs.dataloader``; also in ``pitstop fix``'s runs) and
  ``pitstop bench``'s loader: ``inject`` (every component's ``apply_loader_kwargs``, with the loader
  tuner's own keywords, ``batch_size`` and ``prefetch_factor``);
- profile's record of a loader: ``facts``; profile's rules (``rules.dataloader_rules``): ``rules`` on a
  ``LoaderRun``, with profile's thresholds as a ``LoaderJudge``; ``PHASES`` bound the saving;
- ``pitstop tune loader`` (``pitstop.tune.loader_measure``, ``loader_knobs``): ``KEY``, ``NEEDS_WORKERS``,
  ``DEFAULT``, ``value`` and ``apply_loader_kwargs`` for each measured setting's keywords;
- ``pitstop fix``: ``candidates`` (the worker count: ``pitstop.recipes.workers.choose_workers``);
  ``fix --apply``: ``edit``, one keyword on the ``DataLoader(...)`` call;
- a finding's code: ``SNIPPET``.

No torch import: the keywords are plain values and a built loader is read by attribute.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pitstop.findings import Finding
from pitstop.recipes.component import LOADER, LoaderJudge, ProbeRule
from pitstop.recipes.editing import LoaderEditor
from pitstop.recipes.entries import entry
from pitstop.recipes.workers import WorkerMachine, choose_workers
from pitstop.units import duration as ms

SLOW = "dataloader.slow"  # the workers rule's other finding: the loader has its workers, still slow


def pct(x: float) -> str:
    return f"{100 * x:.0f}%"


@dataclass(frozen=True)
class LoaderRun:
    """What the loader rules read of one profiled run. ``bd``: its ``Breakdown``; ``used``: the records
    of the loaders it drew batches from; ``main``: the one it waited on most; ``cores``: usable cores;
    ``data``: the run's data (other processes' load, ranks: the worker count)."""

    bd: Any
    used: Sequence[Mapping[str, Any]]
    main: Mapping[str, Any]
    cores: int
    device: str | None
    data: Mapping[str, Any] | None = None

    @property
    def cuda(self) -> bool:
        return bool(self.device and self.device.startswith("cuda"))


Candidates = list[tuple[str, dict[str, Any]]] | str  # (name, DataLoader keywords forced), or why none


@dataclass(frozen=True)
class LoaderKeyword:
    """One DataLoader keyword as a component (``component.LoaderComponent``); the parts that differ
    between the three, its rule and its fix candidates, are functions of the record."""

    NAME: str
    KEY: str  # the DataLoader keyword
    FINDING: str
    SNIPPET: str
    RULE: ProbeRule  # its finding's texts (no probe: the rule reads the run's data wait)
    PHASES: tuple[str, ...]  # () for persistent_workers: restarts may fall outside the measured steps
    NEEDS_WORKERS: bool  # DataLoader rejects the keyword without worker processes
    DEFAULT: Any  # torch's value where the call leaves the keyword out (its type: the value's)
    find: Callable[[LoaderKeyword, LoaderRun, LoaderJudge], list[Finding]] = field(repr=False)
    choose: Callable[[LoaderKeyword, Mapping[str, Any], WorkerMachine, Any], Candidates] = field(repr=False)
    SURFACE: str = LOADER
    PROBE: str | None = None
    ARMS: tuple[str, str] = ("as built", "forced")

    @property
    def KNOB(self) -> str:  # the protocol's constant
        """Its ``Knobs`` name: ``dataloader.<KEY>``."""
        return f"dataloader.{self.KEY}"

    def apply_loader_kwargs(
        self, kwargs: Mapping[str, Any], knobs: Mapping[str, Any]
    ) -> tuple[dict[str, Any], dict[str, Any], dict[str, str]]:
        """``kwargs`` with the value ``knobs`` forces for ``KEY`` (none: as they are); what was applied,
        and what was skipped and why (a keyword that needs workers on a loader without any)."""
        kw = dict(kwargs)
        if self.KEY not in knobs:
            return kw, {}, {}
        if self.NEEDS_WORKERS and not (kw.get("num_workers") or 0) > 0:
            return kw, {}, {self.KEY: "needs num_workers > 0"}
        kw[self.KEY] = knobs[self.KEY]
        return kw, {self.KEY: knobs[self.KEY]}, {}

    def value(self, given: Any) -> Any:
        """The keyword's value as given to a DataLoader (None or left out: ``DEFAULT``), as a plain value
        of ``DEFAULT``'s type: the worker count an int, a switch a bool."""
        return type(self.DEFAULT)(given or self.DEFAULT)

    def facts(self, loader: Any) -> dict[str, Any]:
        """The keyword's value on a built DataLoader (the count an int, the switches bools)."""
        return {self.KEY: self.value(getattr(loader, self.KEY))}

    def edit(self, editor: LoaderEditor) -> dict[str, Any]:
        """``KEY=<the fix's value>`` on the loader's ``DataLoader(...)`` call."""
        editor.keywords({self.KEY: editor.setting})
        return {self.KEY: editor.setting}

    def candidates(self, loader: Mapping[str, Any], machine: WorkerMachine, values: Any) -> Candidates:
        return self.choose(self, loader, machine, values)

    def rules(self, run: LoaderRun, judge: LoaderJudge) -> list[Finding]:
        return self.find(self, run, judge)


def inject(kwargs: dict[str, Any], forced: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """``forced`` (``Knobs.dataloader``) into a DataLoader's keywords, in place: every component's
    ``apply_loader_kwargs`` and the loader tuner's ``batch_size`` and ``prefetch_factor``. Returns what
    was applied and what was skipped, and why. Without workers the keywords DataLoader rejects then are
    reset."""
    applied: dict[str, Any] = {}
    skipped: dict[str, str] = {}
    if not forced:
        return applied, skipped
    if "batch_size" in forced:
        if kwargs.get("batch_sampler") is not None:
            skipped["batch_size"] = "the script passes a batch_sampler"
        else:
            kwargs["batch_size"] = applied["batch_size"] = forced["batch_size"]
    for comp in SETTINGS:  # num_workers first: the others may need workers
        kw, a, s = comp.apply_loader_kwargs(kwargs, forced)
        kwargs.update(kw)
        applied.update(a)
        skipped.update(s)
    workers = kwargs.get("num_workers", 0) or 0
    if "prefetch_factor" in forced:
        if workers > 0:
            kwargs["prefetch_factor"] = applied["prefetch_factor"] = forced["prefetch_factor"]
        else:
            skipped["prefetch_factor"] = "needs num_workers > 0"
    if workers == 0:  # DataLoader rejects these without workers
        kwargs["prefetch_factor"] = None
        kwargs["persistent_workers"] = False
    return applied, skipped


# ------------------------------------------------------------------------------------------- workers


def _workers_findings(c: LoaderKeyword, run: LoaderRun, judge: LoaderJudge) -> list[Finding]:
    """The data-wait finding of the ``main`` loader: too few workers when the cores allow more, else a
    slow input pipeline (``SLOW``); none while the wait is under ``WARN_SHARE`` of the step."""
    bd, main, cores = run.bd, run.main, run.cores
    wait = bd.parts["data_wait_s"]
    share = bd.share("data_wait_s")
    if share < judge.WARN_SHARE:
        return []
    workers = main.get("num_workers") or 0
    where = main.get("location")
    choice = choose_workers(WorkerMachine.of_run(run.data, cores))
    evidence = (
        f"data wait {ms(wait)} per step, {pct(share)} of the {ms(bd.total_s)} step, over {bd.n} steps; "
        f"DataLoader with num_workers={workers}, {cores} usable cores"
    )
    data = {"data_wait_s": wait, "num_workers": workers, "usable_cores": cores, "steps": bd.n}
    if workers >= choice.workers:
        return [
            Finding(
                id=SLOW,
                severity=judge.sev(share),
                title="Training waits for data although the loader has the workers the cores allow",
                evidence=f"{evidence} ({choice.basis})",
                data=data,
                fix="The input pipeline is CPU-bound: decode smaller images, move augmentation to the GPU, "
                "or pre-process once and cache the tensors.",
                location=where,
                est_saving_s=wait,
                share=share,
            )
        ]
    suggest = choice.workers
    return [
        Finding(
            id=c.FINDING,
            severity=judge.sev(share),
            title=c.RULE.title,
            evidence=f"{evidence}; {suggest} worker(s) suggested ({choice.basis})",
            data={**data, "suggested_workers": suggest, "worker_cap": choice.cap},
            fix=c.RULE.fix.format(suggest=suggest),
            fix_code=f"DataLoader(..., num_workers={suggest}, persistent_workers=True"
            + (", pin_memory=True" if run.cuda else "")
            + ")",
            location=where,
            est_saving_s=wait,
            share=share,
        )
    ]


def _workers_candidates(
    c: LoaderKeyword, loader: Mapping[str, Any], m: WorkerMachine, values: Any
) -> Candidates:
    """The count ``choose_workers`` gives this machine (what profile suggests) and the most it allows
    (its cap), when they differ; ``values`` replaces them. Each keeps its workers between epochs."""
    if not loader:
        return "workers: the script built no DataLoader"
    choice = choose_workers(m)
    now = int(loader.get("num_workers") or 0)
    counts = values or tuple(sorted({choice.workers, choice.cap}))
    return [
        (f"num_workers={w}", workers_fix(w)) for w in counts if w != now and w > 0
    ]


WORKERS = LoaderKeyword(
    "workers",
    "num_workers",
    "dataloader.workers",
    "DataLoader(..., num_workers={value})",
    ProbeRule(
        "workers",
        title="Training waits for data: the DataLoader has fewer workers than the cores allow",
        evidence="",
        fix="Load batches in {suggest} worker processes and keep them between epochs "
        "(`pitstop tune loader` measures the best count on your data).",
    ),
    ("data_wait_s",),
    False,
    0,
    _workers_findings,
    _workers_candidates,
)


# -------------------------------------------------------------------------------- persistent workers


def _persistent_findings(c: LoaderKeyword, run: LoaderRun, judge: LoaderJudge) -> list[Finding]:
    """For each loader used: worker pools restarted every epoch, the first batch's extra wait spread over
    an epoch's batches; none where it has no workers, keeps them, or the cost is under ``MIN_SHARE``."""
    out = []
    for ld in run.used:
        if not (ld.get("num_workers") or 0) > 0 or ld.get("persistent_workers"):
            continue
        first = ld.get("first_batch_s") or []
        per_epoch = ld.get("batches_per_epoch") or ld.get("batches_seen") or 1
        avg_wait = ld.get("wait_s", 0.0) / max(1, ld.get("batches_seen", 1))
        spawn = max(0.0, (sum(first) / len(first) if first else 0.0) - avg_wait)
        saving, sh = judge.cost(run.bd, spawn / max(1, per_epoch))
        if sh < judge.MIN_SHARE:
            continue  # long epochs amortise the restart: not worth a line
        out.append(
            Finding(
                id=c.FINDING,
                severity=judge.sev(sh),
                title=c.RULE.title,
                evidence=f"the first batch of a fresh worker pool waited {ms(spawn)} more than an average "
                f"batch; over {per_epoch} batches per epoch that is {ms(saving)} per step "
                f"({ld.get('iterators', 0)} worker pool(s) started in this run)",
                data={
                    "first_batch_s": first,
                    "batches_per_epoch": per_epoch,
                    "epochs_seen": ld.get("iterators"),
                },
                fix=c.RULE.fix,
                fix_code=c.SNIPPET,
                location=ld.get("location"),
                est_saving_s=saving,
                share=sh,
            )
        )
    return out


def _persistent_candidates(
    c: LoaderKeyword, loader: Mapping[str, Any], m: WorkerMachine, values: Any
) -> Candidates:
    if not (loader.get("num_workers") or 0) or loader.get("persistent_workers"):
        return "persistent_workers: needs a loader with workers that are not persistent yet"
    return [(c.KEY, {c.KEY: True})]


PERSISTENT_WORKERS = LoaderKeyword(
    "persistent_workers",
    "persistent_workers",
    "dataloader.persistent_workers",
    "DataLoader(..., persistent_workers=True)",
    ProbeRule(
        "persistent_workers",
        title="DataLoader workers are started again every epoch",
        evidence="",
        fix="Keep the workers alive between epochs.",
    ),
    (),
    True,
    False,
    _persistent_findings,
    _persistent_candidates,
)


# ------------------------------------------------------------------------------------------ pinning


def _pin_findings(c: LoaderKeyword, run: LoaderRun, judge: LoaderJudge) -> list[Finding]:
    """Pageable host-to-device copies from the ``main`` loader on CUDA: the cost is the measured copy
    time per step."""
    if not run.cuda or run.main.get("pin_memory"):
        return []
    h2d = run.bd.parts["h2d_s"]
    saving, sh = judge.cost(run.bd, h2d)
    return [
        Finding(
            id=c.FINDING,
            severity=judge.sev(sh),
            title=c.RULE.title,
            evidence=f"host-to-device copies block {ms(h2d)} per step ({pct(sh)}); the loader has "
            "pin_memory=False",
            data={"h2d_s": h2d},
            fix=c.RULE.fix,
            fix_code=c.SNIPPET,
            location=run.main.get("location"),
            est_saving_s=saving,
            share=sh,
        )
    ]


def _pin_candidates(c: LoaderKeyword, loader: Mapping[str, Any], m: WorkerMachine, values: Any) -> Candidates:
    """One switch (not timed by ``pitstop fix`` today: its entry has ``fix=False``)."""
    if loader.get("pin_memory"):
        return "pin_memory: the loader pins its memory already"
    return [(c.KEY, {c.KEY: True})]


PIN_MEMORY = LoaderKeyword(
    "pin_memory",
    "pin_memory",
    "dataloader.pin_memory",
    "DataLoader(..., pin_memory=True)\nx = x.to(device, non_blocking=True)",
    ProbeRule(
        "pin_memory",
        title="Batches are copied to the GPU from pageable memory",
        evidence="",
        fix="Pin the loader's memory and copy with non_blocking=True so copies overlap compute.",
    ),
    ("h2d_s",),
    False,
    False,
    _pin_findings,
    _pin_candidates,
)

SETTINGS = (WORKERS, PERSISTENT_WORKERS, PIN_MEMORY)  # the registry's order: num_workers first
TUNER_KEYS = ("prefetch_factor", "batch_size")  # the loader tuner's own keywords (``inject`` forces them too)
KEYS = tuple(c.KEY for c in SETTINGS) + TUNER_KEYS  # every keyword a knob may force

PATCH = "pitstop.fix.patch.dataloader_patch"  # what ``fix --apply`` writes each keyword with
# their registry entries, in ``SETTINGS``' order: name, snippet, finding, knob are each record's constants
RECIPES = (
    entry(
        __name__,
        "WORKERS",
        title="DataLoader workers",
        bench=(("workers", "DataLoader workers"),),
        apply=PATCH,
        site="loader",
    ),
    entry(__name__, "PERSISTENT_WORKERS", title="persistent workers", apply=PATCH, site="loader"),
    entry(
        __name__,
        "PIN_MEMORY",
        title="pinned memory",
        train="pitstop.train.prefetch.DevicePrefetcher",
        bench=(("pin_memory", "pinned memory"),),
        apply=PATCH,
        fix=False,
        site="loader",
    ),
)


def workers_fix(n: int) -> dict[str, Any]:
    """The workers fix as keywords: ``n`` worker processes, kept between epochs (what ``pitstop fix``
    times and what profile's fresh runs confirm the workers finding with)."""
    return {WORKERS.KEY: n, PERSISTENT_WORKERS.KEY: True}

__all__ = [
    "PERSISTENT_WORKERS",
    "PIN_MEMORY",
    "RECIPES",
    "SETTINGS",
    "SLOW",
    "WORKERS",
    "LoaderKeyword",
    "LoaderRun",
    "inject",
]
