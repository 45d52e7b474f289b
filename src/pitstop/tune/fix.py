"""`pitstop fix`: prove each suggested fix by re-running the user's script with it injected.

1. Profile the script once (``pitstop.profile.runner``); its actionable findings pick the candidates
   (dataloader.workers -> num_workers values + persistent_workers, precision.amp -> autocast,
   memory_format.channels_last, optimizer.foreach, compile.none -> torch.compile, cudnn.benchmark,
   host.page_faults -> pitstop.train.keep_host_memory).
   ``--candidates`` names them explicitly instead (then the profile run is skipped).
2. Run the unmodified baseline and every candidate ``repeats`` times, interleaved (B, C1, C2, B, C1, ...),
   each for a bounded number of steps; compare median steps/s.
3. A candidate *helped* when its median is at least ``min_gain`` faster, every one of its runs beat every
   baseline run (so noise alone rarely passes: 1 in 20 for 3 repeats), it really applied (the override
   was not skipped, compile did not fall back), and its loss stayed finite and close to the baseline's
   (within ``loss_rtol`` of the mean, or of the baseline's own run-to-run spread if larger).
4. While the script waits for data, a compute fix cannot show. So when a loader fix helped, the compute
   candidates rejected for speed are measured again with it in place, against the loader fix alone.
5. The fixes that helped (the best num_workers value only, and the second round's) are combined and
   measured against the baseline again, interleaved with the best single fix re-run in the same round.
   If the combination is slower than that single fix there, the single fix is kept.
6. Output: findings per candidate (helped / measured-and-rejected, with the numbers), the combined
   speed-up, and the code change: a unified diff of the DataLoader call for loader fixes, snippets at
   the model's/optimizer's file:line otherwise.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from pitstop import host_memory
from pitstop.findings import Finding, Report, Severity
from pitstop.hardware import preferred_amp_dtype, usable_cores
from pitstop.matmul import slower_reason
from pitstop.profile.overrides import Overrides
from pitstop.profile.runner import RunResult, RunSpec, run
from pitstop.report.html import Block, bar_chart, table
from pitstop.tune.patch import Patch, dataloader_patch

KINDS = (
    "workers",
    "persistent_workers",
    "amp",
    "channels_last",
    "foreach",
    "compile",
    "cudnn_benchmark",
    "host_memory",
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
}
# info findings that say "not timed here, `pitstop fix` measures it"
UNTIMED_INFO = frozenset({"compile.none", "host.page_faults"})
Runner = Callable[[RunSpec], RunResult]


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
    steps: int = 20
    warmup: int = 5
    repeats: int = 3
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
class Measured:
    """All runs of one configuration."""

    name: str
    kind: str
    overrides: dict[str, Any]
    why: str = ""
    steps_per_s: list[float] = field(default_factory=list)  # one per successful run
    loss_means: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # overrides that did not apply, and why
    median: float | None = None
    speedup: float | None = None
    verdict: str = ""  # baseline | helped | rejected | failed
    reason: str = ""
    # Measured on top of another fix (second round): what it was compared against, and that one's median.
    on_top_of: str | None = None
    # Judged on speed alone (rejected as too slow, or inconclusive): every other check passed.
    speed_only: bool = False
    ref_runs: list[float] = field(default_factory=list)  # that one's steps/s, interleaved with these

    def add(self, r: RunResult) -> None:
        if not r.ok or not r.steps:
            self.errors.append(r.error or f"run ended with status {r.status} and no measured step")
            return
        self.steps_per_s.append(r.steps_per_s())
        finite = [v for v in r.losses if isinstance(v, float) and math.isfinite(v)]
        if r.losses and len(finite) < len(r.losses):
            self.errors.append(f"non-finite loss in {len(r.losses) - len(finite)} of {len(r.losses)} steps")
        if finite:
            self.loss_means.append(statistics.fmean(finite))
        for ld in r.config.get("loaders") or []:
            for k, why in (ld.get("overrides_skipped") or {}).items():
                msg = f"{k}: {why}"
                if msg not in self.skipped:
                    self.skipped.append(msg)
        if r.config.get("compile_error"):
            msg = f"compile fell back to eager: {r.config['compile_error']}"
            if msg not in self.skipped:
                self.skipped.append(msg)
        for msg in r.config.get("override_errors") or []:
            if msg not in self.skipped:
                self.skipped.append(msg)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class FixResult:
    command: list[str]
    baseline: Measured
    candidates: list[Measured] = field(default_factory=list)
    combined: Measured | None = None
    final_single: Measured | None = None  # the best single fix, re-run in the combination's round
    chosen: list[str] = field(default_factory=list)  # names of the fixes recommended together
    speedup: float | None = None  # of the recommendation over the baseline
    patch: Patch | None = None
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


def _device_type(config: dict[str, Any]) -> str:
    dev = str(config.get("device") or "cpu")
    return "cuda" if dev.startswith("cuda") else "cpu"


def _loader(config: dict[str, Any]) -> dict[str, Any]:
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
    dev = _device_type(config)
    loader = _loader(config)
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


# ---------------------------------------------------------------------------------------------- verdict


def judge(m: Measured, base: Measured, cfg: FixConfig) -> None:
    """Set ``m.median``, ``m.speedup``, ``m.verdict`` and ``m.reason`` against the baseline."""
    if m.steps_per_s:
        m.median = statistics.median(m.steps_per_s)
    if m is base:
        m.verdict, m.speedup = "baseline", 1.0 if m.median else None
        if m.errors:
            m.reason = m.errors[0]
        return
    if base.median and m.median:
        m.speedup = m.median / base.median
    if m.errors and not m.steps_per_s:
        m.verdict, m.reason = "failed", m.errors[0]
        return
    if m.errors:
        m.verdict, m.reason = "rejected", m.errors[0]
        return
    if m.skipped:
        m.verdict, m.reason = "rejected", "did not apply: " + "; ".join(m.skipped)
        return
    if m.speedup is None:
        m.verdict, m.reason = "failed", "no measurement"
        return
    if base.loss_means and m.loss_means:
        b, c = statistics.fmean(base.loss_means), statistics.fmean(m.loss_means)
        spread = statistics.pstdev(base.loss_means) if len(base.loss_means) > 1 else 0.0
        tol = max(cfg.loss_rtol * abs(b), 3 * spread, 1e-6)
        if abs(c - b) > tol:
            m.verdict = "rejected"
            m.reason = f"mean loss {c:.4g} vs baseline {b:.4g}: differs by more than {tol:.3g}"
            return
    consistent = len(m.steps_per_s) < 2 or min(m.steps_per_s) > max(base.steps_per_s)
    m.speed_only = True
    if m.speedup >= 1 + cfg.min_gain and consistent:
        m.verdict, m.reason = "helped", f"{m.speedup:.2f}x steps/s"
    elif m.speedup >= 1 + cfg.min_gain:
        m.verdict = "inconclusive"
        m.reason = f"{m.speedup:.2f}x median, but not faster in every run: the runs are too noisy to tell"
    else:
        m.verdict = "rejected"
        m.reason = f"{m.speedup:.2f}x: below the {1 + cfg.min_gain:.2f}x needed"


# ------------------------------------------------------------------------------------------------- run


def _spec(command: list[str], cfg: FixConfig, overrides: Overrides, probes: bool = False) -> RunSpec:
    return RunSpec(
        command=list(command),
        steps=cfg.steps,
        warmup=cfg.warmup,
        timeout=cfg.timeout,
        overrides=overrides,
        cwd=cfg.cwd,
        env=dict(cfg.env),
        probes=probes,
        quiet=True,
    )


def _interleaved(
    command: list[str],
    configs: list[tuple[Measured, Overrides]],
    cfg: FixConfig,
    runner: Runner,
    progress: Callable[[str], None] | None,
    skip_first: Measured | None = None,
) -> None:
    """``repeats`` rounds over ``configs``; ``skip_first`` already ran in round 1 (the baseline run)."""
    total = cfg.repeats * len(configs) - (1 if skip_first else 0)
    i = 0
    for r in range(cfg.repeats):
        for m, ov in configs:
            if r == 0 and m is skip_first:
                continue
            i += 1
            if progress:
                progress(f"run {i}/{total}: {m.name} (round {r + 1}/{cfg.repeats})")
            m.add(runner(_spec(command, cfg, ov)))


def run_fix(
    command: list[str],
    cfg: FixConfig | None = None,
    *,
    runner: Runner | None = None,
    progress: Callable[[str], None] | None = None,
) -> FixResult:
    """Measure the candidate fixes for ``command``; ``runner`` replaces ``pitstop.profile.runner.run`` in
    tests. Ctrl-C stops the measuring and reports what was measured."""
    cfg = cfg or FixConfig()
    runner = runner or run
    base = Measured("baseline (your script as it is)", "baseline", {}, verdict="baseline")
    result = FixResult(command=list(command), baseline=base)
    result.settings = {k: v for k, v in asdict(cfg).items() if k != "env"}
    try:
        if cfg.candidates is None:
            if progress:
                progress("profiling the script to choose candidates")
            prof = runner(_spec(command, cfg, Overrides(), probes=True))
            if not prof.ok or not prof.steps:
                result.baseline_error = prof.error or f"the script ended with status {prof.status}"
                base.errors.append(result.baseline_error)
                return _finish(result, cfg)
            result.config = prof.config
            result.profile_findings = prof.report().findings
            kinds = kinds_from_findings(result.profile_findings)
            hidden = hidden_kinds(result.profile_findings, [k for k, _ in kinds])
        else:
            kinds = [(k, "requested") for k in cfg.candidates]
            hidden = []
            if progress:
                progress("baseline run")
            first = runner(_spec(command, cfg, Overrides()))
            base.add(first)
            if not first.ok or not first.steps:
                result.baseline_error = first.error or f"the script ended with status {first.status}"
                return _finish(result, cfg)
            result.config = first.config
        user_skipped = [
            f"{k}: skipped as asked (--skip), suggested by {why}" for k, why in kinds if k in cfg.skip
        ]
        kinds = [(k, why) for k, why in kinds if k not in cfg.skip]
        cands, skipped = build_candidates(kinds, result.config, cfg)
        result.skipped_candidates = user_skipped + skipped
        measured = [
            Measured(
                c.name, c.kind, c.overrides.to_dict(), c.why, skipped=[c.cannot_help] if c.cannot_help else []
            )
            for c in cands
        ]
        result.candidates = measured
        configs = [(base, Overrides()), *((m, c.overrides) for m, c in zip(measured, cands, strict=True))]
        if cands:
            _interleaved(
                command, configs, cfg, runner, progress, skip_first=base if base.steps_per_s else None
            )
        judge(base, base, cfg)
        for m in measured:
            judge(m, base, cfg)
        if not base.steps_per_s:
            result.baseline_error = base.errors[0] if base.errors else "the baseline never ran a step"
            return _finish(result, cfg)
        helped = [m for m in measured if m.verdict == "helped"]
        # one num_workers value: the fastest
        workers = [m for m in helped if m.kind == "workers"]
        if len(workers) > 1:
            best_w = max(workers, key=lambda m: m.median or 0.0)
            helped = [m for m in helped if m.kind != "workers" or m is best_w]
        later = build_candidates([(k, w) for k, w in hidden if k not in cfg.skip], result.config, cfg)[0]
        helped += _on_top_of_loader_fix(command, helped, measured, later, cfg, runner, progress, result)
        if len(helped) == 1:
            result.chosen, result.speedup = [helped[0].name], helped[0].speedup
        elif len(helped) > 1:
            ov = merge([Overrides.from_dict(m.overrides) for m in helped])
            comb = Measured(
                " + ".join(m.name for m in helped), "combined", ov.to_dict(), "the fixes that helped"
            )
            result.combined = comb
            # The combination and the best single fix in one interleaved round against the script as it
            # is, so the choice between them is made on runs taken side by side, not on separate rounds.
            # (Second-round speed-ups are over the loader fix: not comparable, so not the single fix.)
            best = max((m for m in helped if not m.on_top_of), key=lambda m: m.speedup or 0.0)
            single = Measured(best.name, best.kind, best.overrides, best.why)
            rebase = Measured(base.name, "baseline", {})
            _interleaved(
                command,
                [(rebase, Overrides()), (single, Overrides.from_dict(best.overrides)), (comb, ov)],
                cfg,
                runner,
                progress,
            )
            for m in (rebase, single, comb):
                judge(m, rebase, cfg)
            result.final_single = single
            if comb.median and not comb.errors and comb.median >= (single.median or 0.0):
                result.chosen, result.speedup = [m.name for m in helped], comb.speedup
            else:
                result.chosen, result.speedup = [best.name], single.speedup or best.speedup
    except KeyboardInterrupt:
        result.interrupted = True
        judge(base, base, cfg)
        for m in result.candidates:
            judge(m, base, cfg)
    return _finish(result, cfg)


LOADER_KINDS = frozenset({"workers", "persistent_workers"})


def _on_top_of_loader_fix(
    command: list[str],
    helped: list[Measured],
    measured: list[Measured],
    later: list[Candidate],
    cfg: FixConfig,
    runner: Runner,
    progress: Callable[[str], None] | None,
    result: FixResult,
) -> list[Measured]:
    """Second round. While the script waits for data, a compute fix (autocast, channels_last, ...) cannot
    show: the step is as long as the data wait. When a loader fix helped, the compute candidates that were
    rejected (for speed, not for an error or a loss change) are measured again with the loader fix in
    place, against the loader fix alone, with ``later``: compute fixes whose gain the profile measured
    but found too small a share of a data-bound step to try first. Returns those that helped there."""
    first = next((m for m in helped if m.kind in LOADER_KINDS), None)
    retry = [m for m in measured if m.kind not in LOADER_KINDS and m.speed_only and m.verdict != "helped"]
    retry_kinds = {m.kind for m in retry}
    retry += [
        Measured(c.name, c.kind, c.overrides.to_dict(), c.why)
        for c in later
        if c.kind not in retry_kinds and c.kind not in LOADER_KINDS and not c.cannot_help
    ]
    if first is None or not retry:
        return []
    first_ov = Overrides.from_dict(first.overrides)
    ref = Measured(f"{first.name} alone", "baseline", first.overrides)
    tops = [
        Measured(
            m.name,
            m.kind,
            merge([first_ov, Overrides.from_dict(m.overrides)]).to_dict(),
            m.why,
            on_top_of=first.name,
        )
        for m in retry
    ]
    _interleaved(
        command,
        [(ref, first_ov), *((t, Overrides.from_dict(t.overrides)) for t in tops)],
        cfg,
        runner,
        progress,
    )
    judge(ref, ref, cfg)
    for t in tops:
        judge(t, ref, cfg)
        t.ref_runs = list(ref.steps_per_s)
    result.candidates += tops
    return [t for t in tops if t.verdict == "helped"]


def _finish(result: FixResult, cfg: FixConfig) -> FixResult:
    chosen = [m for m in result.candidates if m.name in result.chosen]
    loader_changes: dict[str, Any] = {}
    for m in chosen:
        loader_changes.update(m.overrides.get("dataloader") or {})
    where = _loader(result.config).get("location")
    if loader_changes and where:
        try:
            result.patch = dataloader_patch(where, loader_changes, cfg.cwd)
        except ValueError as e:
            result.patch_error = str(e)
    return result


# --------------------------------------------------------------------------------------------- report


def _snippet(m: Measured, config: dict[str, Any]) -> tuple[str, str | None]:
    """(code, file:line) for a fix that is not a DataLoader keyword."""
    models = config.get("models") or []
    model_at = models[0].get("first_location") if models else None
    opts = config.get("optimizers") or []
    dev = _device_type(config)
    ov = m.overrides
    if m.kind == "amp":
        return (
            f"with torch.autocast('{dev}', dtype=torch.{ov.get('autocast')}):\n    loss = criterion(model(x), y)",
            model_at,
        )
    if m.kind == "channels_last":
        return (
            "model = model.to(memory_format=torch.channels_last)\nx = x.to(memory_format=torch.channels_last)",
            model_at,
        )
    if m.kind == "foreach":
        name = opts[0].get("type", "SGD") if opts else "SGD"
        return f"torch.optim.{name}(params, ..., {ov.get('optimizer_impl')}=True)", opts[0].get(
            "location"
        ) if opts else None
    if m.kind == "compile":
        return "model = torch.compile(model)", model_at
    if m.kind == "cudnn_benchmark":
        return "torch.backends.cudnn.benchmark = True", None
    if m.kind == "host_memory":
        return host_memory.SNIPPET, None
    dl = ov.get("dataloader") or {}
    return "DataLoader(..., " + ", ".join(f"{k}={v!r}" for k, v in dl.items()) + ")", _loader(config).get(
        "location"
    )


def _runs_text(runs: list[float]) -> str:
    return ", ".join(f"{v:.3g}" for v in runs) or "none"


def fix_findings(result: FixResult) -> list[Finding]:
    out: list[Finding] = []
    base = result.baseline
    if result.baseline_error and not base.steps_per_s:
        out.append(
            Finding(
                id="fix.baseline",
                severity=Severity.ERROR,
                title="The script did not run, so no fix could be measured",
                evidence=result.baseline_error,
                fix="Make `pitstop profile -- <command>` run first.",
            )
        )
        return out
    for m in result.candidates:
        ref_runs = m.ref_runs if m.on_top_of else base.steps_per_s
        ref_median = statistics.median(ref_runs) if ref_runs else None
        ref_step = 1 / ref_median if ref_median else None
        step = 1 / m.median if m.median else None
        saving = ref_step - step if ref_step and step else None
        code, where = _snippet(m, result.config)
        against = f"{m.on_top_of} alone" if m.on_top_of else "the baseline"
        numbers = (
            f"{m.median:.3g} vs {ref_median:.3g} steps/s for {against} ({m.speedup:.2f}x), medians of runs "
            f"[{_runs_text(m.steps_per_s)}] vs [{_runs_text(ref_runs)}], interleaved"
            if m.median and ref_median and m.speedup
            else f"runs failed: {'; '.join(m.errors[:2])}"
        )
        name = f"{m.name} (with {m.on_top_of})" if m.on_top_of else m.name
        loss = (
            f"; mean loss {statistics.fmean(m.loss_means):.4g} vs {statistics.fmean(base.loss_means):.4g}"
            if m.loss_means and base.loss_means
            else ""
        )
        if m.verdict == "helped":
            out.append(
                Finding(
                    id=f"fix.{m.kind}",
                    severity=Severity.WARN,
                    title=f"{name}: {m.speedup:.2f}x faster, measured",
                    evidence=numbers + loss + (f"; suggested by {m.why}" if m.why != "requested" else ""),
                    data=m.to_dict(),
                    fix="Make this change (the speed-up was measured by re-running your script with it).",
                    fix_code=code,
                    location=where,
                    est_saving_s=saving,
                    share=(saving / ref_step) if saving and ref_step else None,
                )
            )
        elif m.verdict == "inconclusive":
            out.append(
                Finding(
                    id=f"fix.{m.kind}",
                    severity=Severity.INFO,
                    title=f"{name}: inconclusive (noisy runs)",
                    evidence=f"{m.reason}; {numbers}{loss}",
                    data=m.to_dict(),
                    fix="Not proven either way: re-run with more --repeats and --steps, on a quieter machine.",
                    fix_code=code,
                    location=where,
                )
            )
        else:
            out.append(
                Finding(
                    id=f"fix.{m.kind}",
                    severity=Severity.INFO,
                    title=f"{name}: measured and rejected" if m.verdict != "failed" else f"{name}: failed",
                    evidence=f"{m.reason}; {numbers}{loss}",
                    data=m.to_dict(),
                    fix="Leave it as it is: it did not make this script faster here.",
                    location=where,
                )
            )
    for s in result.skipped_candidates:
        out.append(Finding(id="fix.skipped", severity=Severity.INFO, title="Candidate not tried", evidence=s))
    if result.chosen:
        names = " + ".join(result.chosen)
        comb = result.combined
        ev = f"{names}: {result.speedup:.2f}x steps/s over the unmodified script"
        if comb is not None and comb.median:
            ev += f" (combined run: {comb.speedup:.2f}x, runs [{_runs_text(comb.steps_per_s)}])"
            single = result.final_single
            if comb.name != names and single is not None and single.median:
                ev += (
                    f"; the combination {comb.name} was not faster than {single.name} alone in the same "
                    f"round ({comb.median:.3g} vs {single.median:.3g} steps/s)"
                )
        code = result.patch.diff if result.patch else None
        out.append(
            Finding(
                id="fix.combined",
                severity=Severity.WARN,
                title=f"Measured speed-up with the fixes that helped: {result.speedup:.2f}x",
                evidence=ev,
                data={"chosen": result.chosen, "speedup": result.speedup},
                fix="Apply the changes above"
                + (" (`pitstop fix --apply` writes the DataLoader diff)." if code else "."),
                fix_code=code,
                location=result.patch and f"{result.patch.path}:{result.patch.line}",
            )
        )
    elif not result.interrupted:
        out.append(
            Finding(
                id="fix.none",
                severity=Severity.PASS,
                title="No candidate fix made this script measurably faster",
                evidence=f"{len(result.candidates)} candidate(s) measured against the baseline "
                f"({base.median:.3g} steps/s)"
                if base.median
                else "nothing measured",
            )
        )
    if result.patch_error:
        out.append(
            Finding(
                id="fix.patch",
                severity=Severity.INFO,
                title="No diff: the DataLoader call could not be edited automatically",
                evidence=result.patch_error,
            )
        )
    return out


def fix_report(result: FixResult, meta: dict[str, Any] | None = None) -> tuple[Report, list[Block]]:
    rows = []
    for m in [result.baseline, *result.candidates, *([result.combined] if result.combined else [])]:
        rows.append(
            [
                f"{m.name} (with {m.on_top_of})" if m.on_top_of else m.name,
                m.verdict,
                _runs_text(m.steps_per_s),
                m.median,
                None if m.speedup is None else round(m.speedup, 3),
                statistics.fmean(m.loss_means) if m.loss_means else None,
                m.reason,
            ]
        )
    report = Report(
        tool="fix",
        findings=fix_findings(result),
        sections={
            "fix": {
                "baseline": result.baseline.to_dict(),
                "candidates": [m.to_dict() for m in result.candidates],
                "combined": result.combined.to_dict() if result.combined else None,
                "chosen": result.chosen,
                "speedup": result.speedup,
                "diff": result.patch.diff if result.patch else None,
                "profile_findings": [f.id for f in result.profile_findings],
            }
        },
        meta={**result.settings, **(meta or {})},
        error=result.baseline_error if not result.baseline.steps_per_s else None,
    )
    if result.interrupted:
        report.error = "interrupted: the report holds the runs measured before Ctrl-C"
    measured = [m for m in [result.baseline, *result.candidates] if m.median]
    blocks = [
        table(
            "Runs (steps/s per run, interleaved with the baseline)",
            ["configuration", "verdict", "steps/s per run", "median", "speed-up", "mean loss", "note"],
            rows,
        ),
        bar_chart(
            "Median steps/s", [m.name for m in measured], [m.median or 0.0 for m in measured], "steps/s"
        ),
    ]
    return report, blocks


__all__ = [
    "KINDS",
    "FixConfig",
    "FixResult",
    "Measured",
    "Patch",
    "build_candidates",
    "fix_report",
    "judge",
    "kinds_from_findings",
    "parse_candidates",
    "run_fix",
]
