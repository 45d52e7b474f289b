"""DataLoader autotuner: find the fastest num_workers, prefetch_factor, persistent_workers and pin_memory
(and measure batch sizes if asked) on the user's own dataset, by measurement.

This module is the search; measuring one setting is ``loader_measure``, turning points into Findings is
``loader_findings``. num_workers climbs a ladder (0, 1, 2, 3, 4, 6, 8, ...) and stops climbing once
``patience`` points in a row fail to beat the best by ``min_gain``; the neighbourhood of the best is then
refined. The worker count is then picked from the measured curve by ``recipes.workers.choose_workers``,
the rule profile and fix use: the fewest workers within ``min_gain`` of the fastest, never above the
cores' cap (torch's suggested maximum, the cores other processes and ranks leave); the ladder climbs
one rung past the cap by default, so a faster count there is reported. A prefetch depth replaces the
best only when it is ``min_gain`` faster, so ties go to the cheaper setting. RAM and /dev/shm are
predicted before a point runs and watched while it runs (memwatch); a setting that would exhaust them
is rejected with the reason. Finally the script's own setting and the chosen one are measured again,
interleaved, for the speed-up: batches per wall-clock second over the rounds (``measure.throughput``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from pitstop.findings import Finding
from pitstop.measure import Arm, Interval, Progress, Settings, interleave
from pitstop.measure.throughput import Window, pooled, throughput_interval
from pitstop.recipes.workers import WorkerMachine, choose_workers, worker_cap
from pitstop.tune.loader_findings import (
    best_finding,
    dataset_failure,
    iterable_finding,
    sweep_findings,
    unpicklable_finding,
)
from pitstop.tune.loader_knobs import persistent_finding, pin_memory_finding
from pitstop.tune.loader_measure import (
    LoaderPoint,
    LoaderSetting,
    MeasureConfig,
    TuneConfig,
    measure_setting,
    picklable,
    predict_rejection,
    setting_from_kwargs,
    start_method,
)
from pitstop.tune.memwatch import MemLimits

WORKER_LADDER = (0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)


@dataclass
class LoaderTuneResult:
    baseline: LoaderSetting
    chosen: LoaderSetting
    points: list[LoaderPoint]
    findings: list[Finding]
    speedup: float | None  # chosen vs baseline: throughput over the interleaved confirmation rounds
    baseline_rate: float | None
    chosen_rate: float | None
    interrupted: bool = False
    meta: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "baseline": asdict(self.baseline),
            "chosen": asdict(self.chosen),
            "chosen_kwargs": self.chosen.kwargs(),
            "points": [p.to_dict() for p in self.points],
            "findings": [f.to_dict() for f in self.findings],
            "speedup": self.speedup,
            "baseline_rate": self.baseline_rate,
            "chosen_rate": self.chosen_rate,
            "interrupted": self.interrupted,
            "meta": self.meta,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LoaderTuneResult:
        def point(p: dict[str, Any]) -> LoaderPoint:
            p = dict(p)
            p.pop("label", None)
            p["setting"] = LoaderSetting(**p["setting"])
            return LoaderPoint(**p)

        return cls(
            baseline=LoaderSetting(**d["baseline"]),
            chosen=LoaderSetting(**d["chosen"]),
            points=[point(p) for p in d["points"]],
            findings=[Finding.from_dict(f) for f in d["findings"]],
            speedup=d.get("speedup"),
            baseline_rate=d.get("baseline_rate"),
            chosen_rate=d.get("chosen_rate"),
            interrupted=bool(d.get("interrupted")),
            meta=d.get("meta", {}),
        )


MeasureFn = Callable[[LoaderSetting], LoaderPoint]
ProgressFn = Callable[[str], None]
PointFn = Callable[[LoaderTuneResult], None]
Rates = tuple[float | None, float | None, float | None]  # baseline, chosen batches/s; speed-up


def default_max_workers(cap: int) -> int:
    """The ladder's top by default: the first rung past ``cap``, so the sweep shows whether more workers
    than the cores allow would have loaded faster."""
    return next((w for w in WORKER_LADDER if w > cap), cap + 1)


def worker_candidates(max_workers: int) -> list[int]:
    ladder = [w for w in WORKER_LADDER if w <= max_workers]
    if max_workers not in ladder:
        ladder.append(max_workers)
    return sorted(ladder)


class _Sweep:
    """Holds measured points (each setting measured once) and the running best."""

    def __init__(self, measure: MeasureFn, cfg: TuneConfig, progress: ProgressFn | None) -> None:
        self.measure, self.cfg, self.progress = measure, cfg, progress
        self.points: dict[LoaderSetting, LoaderPoint] = {}
        self.order: list[LoaderPoint] = []
        self.best: LoaderPoint | None = None
        self.on_point: Callable[[], None] | None = None  # after each new point and each new best

    def get(self, setting: LoaderSetting, role: str) -> LoaderPoint:
        setting = setting.normalized()
        if setting in self.points:
            return self.points[setting]
        reason = predict_rejection(setting, self.order, self.cfg.measure.limits, self.cfg.ram_safety)
        if reason:
            p = LoaderPoint(setting=setting, status="rejected", reason=reason, role=role)
        else:
            if self.progress:
                self.progress(f"measuring {setting.label()}")
            p = self.measure(setting)
            p.role = role
        self.points[setting] = p
        self.order.append(p)
        self.changed()
        return p

    def changed(self) -> None:
        if self.on_point is not None:
            self.on_point()

    def consider(self, p: LoaderPoint) -> bool:
        """Adopt ``p`` as best when it beats the best by min_gain. Returns whether it did."""
        if not p.ok:
            return False
        if self.best is None or p.batches_per_s > self.best.batches_per_s * (1 + self.cfg.min_gain):  # type: ignore[operator]
            self.best = p
            self.changed()
            return True
        return False


def tune_loader(
    dataset: Any,
    base_kwargs: dict[str, Any] | None = None,
    config: TuneConfig | None = None,
    *,
    measure: MeasureFn | None = None,
    progress: ProgressFn | None = None,
    location: str | None = None,
    on_point: PointFn | None = None,
) -> LoaderTuneResult:
    """Find the fastest DataLoader setting for ``dataset`` by measuring; ``base_kwargs`` is the script's own
    DataLoader(...) keywords (its num_workers etc. are the baseline), ``location`` its file:line.
    ``measure`` replaces the real measurement (tests); Ctrl-C returns what was measured so far with
    ``interrupted=True``. ``on_point`` gets that result (the points so far, ``interrupted=True``) after
    each new point, for a caller that may be killed before this returns (script mode).
    """
    cfg = config or TuneConfig()
    base_kwargs = dict(base_kwargs or {})
    baseline = setting_from_kwargs(base_kwargs)
    machine = WorkerMachine.here()
    cap = worker_cap(machine)
    max_w = cfg.max_workers if cfg.max_workers is not None else default_max_workers(cap)
    findings: list[Finding] = []
    meta: dict[str, Any] = {
        "usable_cores": machine.cores,
        "max_workers": max_w,
        "worker_cap": cap,
        "min_gain": cfg.min_gain,
    }

    def real_measure(s: LoaderSetting) -> LoaderPoint:
        return measure_setting(dataset, s, base_kwargs, cfg.measure)

    sweep = _Sweep(measure or real_measure, cfg, progress)
    if on_point is not None:  # max_w read when called: an unpicklable dataset lowers it below
        sweep.on_point = lambda: on_point(_so_far(sweep, baseline, findings, location, max_w, meta))

    if measure is None:
        meta["start_method"] = start_method(base_kwargs)
        if not _dataset_findings(dataset, meta["start_method"], findings):
            max_w = 0  # workers cannot start: only num_workers=0 is measured
    else:
        meta["start_method"] = "fork"

    interrupted = False
    chosen = baseline
    try:
        base_point = sweep.get(baseline, "baseline")
        if not base_point.ok and base_point.status == "failed" and baseline.num_workers == 0:
            findings.append(dataset_failure(base_point))
            return LoaderTuneResult(baseline, baseline, sweep.order, findings, None, None, None, False, meta)
        sweep.consider(base_point)

        def persistent(chosen: LoaderSetting, best: LoaderPoint | None) -> Finding | None:
            return persistent_finding(dataset, base_kwargs, chosen, best) if measure is None else None

        chosen = _search(sweep, baseline, max_w, machine, meta, findings, persistent)
    except KeyboardInterrupt:
        interrupted = True
        if sweep.best is not None:
            chosen = sweep.best.setting

    rates: Rates = (None, None, None)
    if not interrupted:
        try:
            pin = pin_memory_finding(
                base_kwargs, chosen, dataset if measure is None else None, cfg, measure_setting
            )
            findings.append(pin)
            if pin.data.get("recommend"):
                chosen = replace(chosen, pin_memory=True)
            # 6. confirm: baseline and chosen again, interleaved, for the speed-up.
            rates = _confirm(sweep, baseline, chosen, cfg, progress, meta)
        except KeyboardInterrupt:
            interrupted = True
    if rates[2] is None:
        rates = _point_rates(sweep, baseline, chosen)
    sweep.on_point = None
    return _result(sweep, baseline, chosen, findings, rates, interrupted, location, max_w, meta)


def _dataset_findings(dataset: Any, method: str, findings: list[Finding]) -> bool:
    """Add what the dataset itself rules out (not picklable, iterable); returns whether workers can
    start (an unpicklable dataset cannot reach spawn/forkserver workers)."""
    workers_ok = True
    ok_pickle, why = picklable(dataset)
    if not ok_pickle:
        findings.append(unpicklable_finding(why, method))
        workers_ok = method == "fork"
    if _is_iterable(dataset):
        findings.append(iterable_finding(dataset))
    return workers_ok


def _search(
    sweep: _Sweep,
    baseline: LoaderSetting,
    max_w: int,
    machine: WorkerMachine,
    meta: dict[str, Any],
    findings: list[Finding],
    persistent: Callable[[LoaderSetting, LoaderPoint | None], Finding | None],
) -> LoaderSetting:
    """Steps 1-5 after the baseline point: the setting chosen (pin_memory and the confirmation follow)."""
    # 1-2. num_workers: the measured curve and recipes.workers' pick from it.
    _worker_curve(sweep, replace(baseline, prefetch_factor=None), max_w, machine, meta)
    best = sweep.best
    # 3. prefetch depth at the best worker count.
    if best is not None and best.setting.num_workers > 0:
        for pf in sweep.cfg.prefetch_factors:
            sweep.consider(sweep.get(replace(best.setting, prefetch_factor=pf), "prefetch"))
    best = sweep.best
    chosen = best.setting if best is not None else baseline

    # 4. persistent_workers: the per-epoch worker start-up it saves, measured.
    if chosen.num_workers > 0 and not chosen.persistent_workers:
        f = persistent(chosen, best)
        if f is not None:
            findings.append(f)
            if f.data.get("recommend"):
                chosen = replace(chosen, persistent_workers=True)

    # 5. batch sizes, if asked: reported, not chosen (batch size changes the optimisation too).
    for bs in sweep.cfg.batch_sizes:
        sweep.get(replace(chosen, batch_size=bs), "batch_size")
    return chosen


def _so_far(
    sweep: _Sweep,
    baseline: LoaderSetting,
    findings: list[Finding],
    location: str | None,
    max_w: int,
    meta: dict[str, Any],
) -> LoaderTuneResult:
    """The result of the points measured so far, as a search interrupted now would give it."""
    now = sweep.best.setting if sweep.best is not None else baseline
    rates = _point_rates(sweep, baseline, now)
    return _result(sweep, baseline, now, findings, rates, True, location, max_w, meta)


def _point_rates(sweep: _Sweep, baseline: LoaderSetting, chosen: LoaderSetting) -> Rates:
    """The speed-up from the sweep's own points of the two settings (no confirmation rounds)."""
    bp, cp = sweep.points.get(baseline.normalized()), sweep.points.get(chosen.normalized())
    if bp and cp and bp.ok and cp.ok:
        return bp.batches_per_s, cp.batches_per_s, cp.batches_per_s / bp.batches_per_s  # type: ignore[operator]
    return None, None, None


def _result(
    sweep: _Sweep,
    baseline: LoaderSetting,
    chosen: LoaderSetting,
    findings: list[Finding],
    rates: Rates,
    interrupted: bool,
    location: str | None,
    max_w: int,
    meta: dict[str, Any],
) -> LoaderTuneResult:
    """The result of the points measured so far: the best-setting finding first, then ``findings`` and
    the sweep's own (``findings`` and ``meta`` are not changed)."""
    base_rate, chosen_rate, speedup = rates
    iv = Interval(**meta["confirm_interval"]) if meta.get("confirm_interval") else None
    best = best_finding(
        baseline,
        chosen,
        base_rate,
        chosen_rate,
        speedup,
        location,
        sweep.cfg,
        interval=iv,
        workers_basis=(meta.get("workers_choice") or {}).get("basis"),
    )
    meta = {
        **meta,
        "points_measured": sum(1 for p in sweep.order if not p.reason.startswith("predicted")),
        "exhaustive_worker_points": len(worker_candidates(max_w)),
    }
    found = [best, *findings, *sweep_findings(sweep.order)]
    return LoaderTuneResult(
        baseline, chosen, list(sweep.order), found, speedup, base_rate, chosen_rate, interrupted, meta
    )


def _worker_curve(
    sweep: _Sweep, template: LoaderSetting, max_w: int, machine: WorkerMachine, meta: dict[str, Any]
) -> None:
    """num_workers with the script's other settings (``template``): climb the ladder until it stops
    rising, refine between the pick and its ladder neighbours, and make ``recipes.workers``' pick from
    the measured points the sweep's best."""
    cfg = sweep.cfg
    # 1. climb the ladder, stop when it stops rising.
    ladder = worker_candidates(max_w)
    stale, stopped_at = 0, None
    for w in ladder:
        p = sweep.get(replace(template, num_workers=w), "sweep")
        if not p.ok:
            if w > 0:
                stopped_at = w
                break  # more workers need more memory / will crash the same way
            continue
        if p is sweep.best:  # the baseline, already counted
            continue
        if sweep.consider(p):
            stale = 0
        else:
            stale += 1
            if stale >= cfg.patience:
                stopped_at = w
                break
    meta["climb_stopped_at"] = stopped_at
    _pick_workers(sweep, template, machine, meta)
    # 2. refine between the pick and its ladder neighbours.
    best_w = sweep.best.setting.num_workers if sweep.best else 0
    if best_w in ladder:
        i = ladder.index(best_w)
        around = []
        if i > 0:
            around.append((ladder[i - 1] + best_w) // 2)
        if i + 1 < len(ladder) and (stopped_at is None or ladder[i + 1] <= stopped_at):
            around.append((best_w + ladder[i + 1]) // 2)
        for w in around:
            if w not in (best_w, *ladder):
                sweep.get(replace(template, num_workers=w), "refine")
    _pick_workers(sweep, template, machine, meta)


def _pick_workers(
    sweep: _Sweep, template: LoaderSetting, machine: WorkerMachine, meta: dict[str, Any]
) -> None:
    """Make the sweep's best the worker count ``recipes.workers.choose_workers`` picks from the points
    measured with the script's other settings."""
    curve = {
        p.setting.num_workers: p
        for p in sweep.order
        if p.ok and p.setting == replace(template, num_workers=p.setting.num_workers).normalized()
    }
    if not curve:
        return
    choice = choose_workers(
        machine, {w: p.batches_per_s or 0.0 for w, p in curve.items()}, sweep.cfg.min_gain
    )
    # not on the curve only when no count at or under the cap was measured: then the fewest measured
    sweep.best = curve.get(choice.workers) or curve[min(curve)]
    sweep.changed()
    meta["workers_choice"] = {
        "workers": sweep.best.setting.num_workers if sweep.best else None,
        "cap": choice.cap,
        "basis": choice.basis,
        "faster_above_cap": choice.faster_above_cap,
    }


def _confirm(
    sweep: _Sweep,
    baseline: LoaderSetting,
    chosen: LoaderSetting,
    cfg: TuneConfig,
    progress: ProgressFn | None,
    meta: dict[str, Any],
) -> Rates:
    if chosen.normalized() == baseline.normalized() or cfg.confirm_rounds <= 0:
        p = sweep.points.get(baseline.normalized())
        rate = p.batches_per_s if p and p.ok else None
        return rate, rate, 1.0 if rate else None
    settings = {"baseline": baseline, "chosen": chosen}
    windows: dict[str, list[Window]] = {"baseline": [], "chosen": []}

    def sample(name: str) -> list[float] | None:
        p = sweep.measure(settings[name].normalized())
        p.role = "confirm"
        if not p.ok:
            windows[name].append(Window(0, 0.0))  # keeps the rounds paired
            return None
        windows[name].append(Window(p.batches, p.seconds))
        return [1.0 / w for w in p.windows if w > 0] or [1.0 / p.batches_per_s]  # type: ignore[operator]

    def report(pr: Progress) -> None:
        if progress:
            progress(f"confirming: {pr.text()}, script's setting vs chosen")

    arm_b, arm_c = Arm("baseline"), Arm("chosen")  # the timing engine's rotating rounds, every one run
    interleave(arm_b, [arm_c], sample, Settings.every_round(cfg.confirm_rounds), on_progress=report)
    meta["confirm_batches_per_s"] = {k: [w.rate for w in v if w.rate] for k, v in windows.items()}
    iv = throughput_interval(windows["baseline"], windows["chosen"])
    if iv is not None and math.isfinite(iv.hi):
        meta["confirm_interval"] = iv.to_dict()
    b, c = pooled(windows["baseline"]).rate, pooled(windows["chosen"]).rate
    if iv is None or b is None or c is None:
        return None, None, None
    return b, c, iv.estimate


def tune_config_from_dict(d: dict[str, Any]) -> TuneConfig:
    """Inverse of ``dataclasses.asdict(TuneConfig)`` (script mode sends the config as JSON)."""
    d = dict(d)
    m = dict(d.pop("measure", None) or {})
    m["limits"] = MemLimits(**(m.get("limits") or {}))
    for key in ("prefetch_factors", "batch_sizes"):
        if key in d:
            d[key] = tuple(d[key])
    return TuneConfig(**d, measure=MeasureConfig(**m))


def _is_iterable(dataset: Any) -> bool:
    from torch.utils.data import IterableDataset

    return isinstance(dataset, IterableDataset)
