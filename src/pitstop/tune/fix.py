"""`pitstop fix`: prove each suggested fix by re-running the user's script with it injected.

This module holds the candidates: the profile's actionable findings pick them (dataloader.workers ->
num_workers values + persistent_workers, precision.amp -> autocast, memory_format.channels_last,
optimizer.foreach, compile.none -> torch.compile, cudnn.benchmark, host.page_faults ->
pitstop.train.keep_host_memory), or ``--candidates`` names them; ``build_candidates`` turns them into
Overrides for this script and machine. The rest of fix lives beside it: ``fixrun`` (profile, rounds of
child runs, second round, combination), ``fixjudge`` (runs -> verdicts through ``pitstop.measure``),
``fixreport`` (findings, report, HTML) and ``apply`` (patches for every fix with a code location).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field, fields
from typing import Any

from pitstop.findings import Finding, Severity
from pitstop.host.cpu import usable_cores
from pitstop.host.precision import preferred_amp_dtype
from pitstop.matmul import slower_reason
from pitstop.measure import Interval
from pitstop.profile.overrides import Overrides
from pitstop.tune.fixjudge import Measured, judge
from pitstop.tune.patch import Patch

KINDS = (
    "workers",
    "persistent_workers",
    "amp",
    "channels_last",
    "foreach",
    "compile",
    "cudnn_benchmark",
    "host_memory",
    "threads",
)
# finding id from profile -> candidate kind
FINDING_KINDS = {
    "dataloader.workers": "workers",
    "dataloader.persistent_workers": "persistent_workers",
    "precision.amp": "amp",
    "memory_format.channels_last": "channels_last",
    "optimizer.foreach": "foreach",
    "compile.none": "compile",
    "cudnn.benchmark": "cudnn_benchmark",
    "host.page_faults": "host_memory",
    "distributed.threads": "threads",
}
# info findings that say "not timed here, `pitstop fix` measures it"
UNTIMED_INFO = frozenset({"compile.none", "host.page_faults"})
LOADER_KINDS = frozenset({"workers", "persistent_workers"})


def parse_candidates(text: str) -> tuple[str, ...] | None:
    """'auto' -> None (from the profile); 'all' -> every kind; else a validated comma list."""
    t = text.strip().lower()
    if t in ("", "auto"):
        return None
    if t == "all":
        return KINDS
    names = tuple(n.strip() for n in t.split(",") if n.strip())
    bad = [n for n in names if n not in KINDS]
    if bad:
        raise ValueError(f"unknown candidate(s) {', '.join(bad)}; choose from {', '.join(KINDS)}")
    return names


@dataclass
class FixConfig:
    steps: int | None = None  # timed steps per run; None: from the start-up (fixrun.steps_from_run)
    warmup: int = 5  # steps per run before the measured ones
    budget: float = 300.0  # seconds for the whole of fix: profile run, every round, the combination
    min_rounds: int = 3  # rounds before any verdict
    max_rounds: int = 40  # a cap per stage; the budget ends the rounds first
    candidates: tuple[str, ...] | None = None  # None: chosen from the profile's findings
    skip: tuple[str, ...] = ()  # kinds never tried (e.g. "compile": minutes per run on a big model)
    min_gain: float = 0.05
    loss_rtol: float = 0.1
    timeout: float | None = 600.0
    workers_values: tuple[int, ...] | None = None  # default: usable cores and 2x (at most 8)
    cwd: str | None = None
    env: dict[str, str] = field(default_factory=dict)


@dataclass
class Candidate:
    name: str
    kind: str
    overrides: Overrides
    why: str  # the finding that suggested it, or "requested"
    cannot_help: str | None = None  # the script's own facts say it has nothing to act on (still measured)


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
    baseline_error: str | None = None
    interrupted: bool = False
    skipped_candidates: list[str] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)  # the FixConfig it ran with

    @property
    def baseline_steps(self) -> bool:
        return bool(self.baseline.steps_per_s)


# ------------------------------------------------------------------------------------------ candidates


def device_type(config: dict[str, Any]) -> str:
    dev = str(config.get("device") or "cpu")
    return "cuda" if dev.startswith("cuda") else "cpu"


def loader_of(config: dict[str, Any]) -> dict[str, Any]:
    loaders = (
        [ld for ld in config.get("loaders") or [] if ld.get("batches_seen")] or config.get("loaders") or []
    )
    return max(loaders, key=lambda ld: ld.get("wait_s") or 0.0) if loaders else {}


def build_candidates(
    kinds: list[tuple[str, str]], config: dict[str, Any], cfg: FixConfig
) -> tuple[list[Candidate], list[str]]:
    """(kind, why) pairs -> concrete Overrides for this script and machine; plus kinds skipped and why."""
    out: list[Candidate] = []
    skipped: list[str] = []
    dev = device_type(config)
    loader = loader_of(config)
    models = config.get("models") or []
    workers_now = int(loader.get("num_workers") or 0)
    for kind, why in kinds:
        if kind == "workers":
            if not loader:
                skipped.append("workers: the script built no DataLoader")
                continue
            cores = usable_cores()
            values = cfg.workers_values or tuple(sorted({min(8, cores), min(8, 2 * cores)}))
            for w in values:
                if w != workers_now and w > 0:
                    ov = Overrides(dataloader={"num_workers": w, "persistent_workers": True})
                    out.append(Candidate(f"num_workers={w}", kind, ov, why))
        elif kind == "persistent_workers":
            if workers_now == 0 or loader.get("persistent_workers"):
                skipped.append("persistent_workers: needs a loader with workers that are not persistent yet")
                continue
            out.append(
                Candidate("persistent_workers", kind, Overrides(dataloader={"persistent_workers": True}), why)
            )
        elif kind == "amp":
            if any(md.get("autocast") for md in models):
                skipped.append("amp: the script already runs its forward under autocast")
                continue
            dtype = preferred_amp_dtype(dev)
            if dtype is None and why != "requested":
                skipped.append(f"amp: this {dev} has no fast low-precision math")
                continue
            if dtype is None and (slow := slower_reason("bfloat16", dev)):  # asked for on hardware without it
                skipped.append(f"amp: {slow}")
                continue
            dtype = dtype or "bfloat16"
            out.append(Candidate(f"autocast {dtype}", kind, Overrides(autocast=dtype), why))
        elif kind == "channels_last":
            known = [md for md in models if "conv2d_layers" in md and "input_shapes" in md]
            no_4d = bool(known) and not any(
                md["conv2d_layers"] or any(len(sh) == 4 for sh in md["input_shapes"] or []) for md in known
            )
            why_not = (
                "the model has no Conv2d layer and no 4-D input, so channels_last has nothing to change"
                if no_4d
                else None
            )
            out.append(Candidate("channels_last", kind, Overrides(channels_last=True), why, why_not))
        elif kind == "foreach":
            opts = config.get("optimizers") or []
            if opts and all(o.get("impl") in ("foreach", "fused") for o in opts):
                skipped.append("foreach: every optimizer already uses a foreach/fused implementation")
                continue
            impl = "fused" if dev == "cuda" else "foreach"
            out.append(Candidate(f"optimizer {impl}", kind, Overrides(optimizer_impl=impl), why))
        elif kind == "compile":
            out.append(Candidate("torch.compile", kind, Overrides(compile=True), why))
        elif kind == "cudnn_benchmark":
            if dev != "cuda" and why != "requested":
                skipped.append("cudnn_benchmark: no CUDA device in this run")
                continue
            out.append(Candidate("cudnn.benchmark", kind, Overrides(cudnn_benchmark=True), why))
        elif kind == "host_memory":
            if config.get("host_memory"):
                skipped.append(
                    f"host_memory: the script already called keep_host_memory ({config['host_memory']})"
                )
                continue
            if dev != "cpu" and why != "requested":
                skipped.append(
                    f"host_memory: the model trains on {dev}; host page faults matter for CPU steps"
                )
                continue
            out.append(Candidate("keep host memory", kind, Overrides(keep_host_memory=True), why))
        elif kind == "threads":  # ranks of a launcher sharing the cores: each gets its share
            n = max(1, usable_cores() // int(config.get("local_world_size") or 1))
            out.append(Candidate(f"{n} threads per rank", kind, Overrides(num_threads=n), why))
    return out, skipped


def kinds_from_findings(findings: list[Finding]) -> list[tuple[str, str]]:
    """Actionable findings -> candidate kinds, in rank order: warnings and errors, and the info findings
    whose gain the profile could not time (compile.none always; host.page_faults when unprobed)."""
    seen: dict[str, str] = {}
    for f in sorted(findings, key=lambda f: (-f.severity.rank, -(f.est_saving_s or 0.0))):
        kind = FINDING_KINDS.get(f.id)
        if kind is None or kind in seen:
            continue
        if f.severity in (Severity.WARN, Severity.ERROR) or (
            f.id in UNTIMED_INFO and f.severity is Severity.INFO and f.est_saving_s is None
        ):
            seen[kind] = f.id
    if "workers" in seen:
        seen.pop("persistent_workers", None)  # the workers candidates already make them persistent
    return list(seen.items())


def hidden_kinds(findings: list[Finding], taken: list[str]) -> list[tuple[str, str]]:
    """Compute fixes the profile measured a gain for (a probe's saving) that was too small a share of the
    step to try first: candidates for the second round, once a loader fix removed the data wait."""
    out: dict[str, str] = {}
    for f in findings:
        kind = FINDING_KINDS.get(f.id)
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
    out = Overrides()
    for o in overrides:
        out.dataloader.update(o.dataloader)
        for f in fields(Overrides):
            if f.name != "dataloader":
                setattr(out, f.name, getattr(out, f.name) or getattr(o, f.name))
    return out


# The orchestration, the report and the patches live in their own modules; importing them from here
# keeps ``from pitstop.tune.fix import run_fix, fix_report`` working without an import cycle.
_ELSEWHERE = {
    "run_fix": "pitstop.tune.fixrun",
    "fix_findings": "pitstop.tune.fixreport",
    "fix_report": "pitstop.tune.fixreport",
}


def __getattr__(name: str) -> Any:
    if name in _ELSEWHERE:
        return getattr(importlib.import_module(_ELSEWHERE[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [  # and, from the modules named in _ELSEWHERE: run_fix, fix_findings, fix_report
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
