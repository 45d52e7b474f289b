"""DataLoader autotuner: measure batches/s for num_workers, prefetch_factor, persistent_workers, pin_memory
(and batch size if asked) on the user's own dataset, and pick the fastest setting by measurement.

How it measures: for each setting a fresh DataLoader is built with the script's other arguments
(collate_fn, sampler, ...), warmed up, then timed over ``repeats`` windows of bounded length; the point's
rate is the median window. num_workers climbs a ladder (0, 1, 2, 3, 4, 6, 8, ...) and stops climbing once
``patience`` points in a row fail to beat the best by ``min_gain``; the neighbourhood of the best is then
refined. A setting replaces the current best only when it is ``min_gain`` faster, so ties go to the
cheaper setting (fewer workers, shallower prefetch). RAM and /dev/shm are predicted before a point runs
and watched while it runs (memwatch); a setting that would exhaust them is rejected with the reason.
Finally the script's own setting and the chosen one are measured again, interleaved, for the speed-up.
"""

from __future__ import annotations

import io
import math
import pickle
import statistics
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from pitstop.findings import Finding, Severity
from pitstop.host.cpu import usable_cores
from pitstop.tune.memwatch import MemLimits, MemWatch, MiB, children_uss, ram_available, shm_free

# DataLoader arguments the tuner sets; everything else the script passed is kept as it was.
TUNED_KEYS = ("num_workers", "prefetch_factor", "persistent_workers", "pin_memory", "batch_size")
WORKER_LADDER = (0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
DEFAULT_PREFETCH = 2  # torch's default when num_workers > 0


@dataclass(frozen=True)
class LoaderSetting:
    num_workers: int = 0
    batch_size: int | None = 1  # None when the loader uses a batch_sampler
    prefetch_factor: int | None = None  # ignored (None) when num_workers == 0
    persistent_workers: bool = False
    pin_memory: bool = False

    def normalized(self) -> LoaderSetting:
        if self.num_workers == 0:
            return replace(self, prefetch_factor=None, persistent_workers=False)
        return replace(self, prefetch_factor=self.prefetch_factor or DEFAULT_PREFETCH)

    def kwargs(self) -> dict[str, Any]:
        s = self.normalized()
        d: dict[str, Any] = {"num_workers": s.num_workers, "pin_memory": s.pin_memory}
        if s.batch_size is not None:
            d["batch_size"] = s.batch_size
        if s.num_workers > 0:
            d["prefetch_factor"] = s.prefetch_factor
            d["persistent_workers"] = s.persistent_workers
        return d

    def label(self) -> str:
        s = self.normalized()
        parts = [f"workers={s.num_workers}"]
        if s.num_workers:
            parts.append(f"prefetch={s.prefetch_factor}")
        if s.persistent_workers:
            parts.append("persistent")
        if s.pin_memory:
            parts.append("pin")
        if s.batch_size is not None:
            parts.append(f"bs={s.batch_size}")
        return " ".join(parts)


def setting_from_kwargs(kwargs: dict[str, Any]) -> LoaderSetting:
    """The setting a script's own DataLoader(...) call used (torch defaults for what it left out)."""
    bs = None if kwargs.get("batch_sampler") is not None else kwargs.get("batch_size", 1)
    return LoaderSetting(
        num_workers=int(kwargs.get("num_workers", 0) or 0),
        batch_size=bs,
        prefetch_factor=kwargs.get("prefetch_factor"),
        persistent_workers=bool(kwargs.get("persistent_workers", False)),
        pin_memory=bool(kwargs.get("pin_memory", False)),
    ).normalized()


@dataclass
class LoaderPoint:
    """One measured setting. Rates are medians over the timed windows; memory is growth while it ran."""

    setting: LoaderSetting
    status: str = "ok"  # ok | rejected (memory) | failed (exception / worker crash)
    reason: str = ""
    batches_per_s: float | None = None
    samples_per_s: float | None = None
    windows: list[float] = field(default_factory=list)  # batches/s of each timed window
    batches: int = 0
    first_batch_s: float | None = None  # iterator creation (worker start-up) to first batch
    peak_rss: int | None = None  # pitstop process + workers, bytes
    peak_shm_growth: int | None = None
    worker_uss: int | None = None  # mean unique memory per worker, bytes
    batch_bytes: int | None = None
    role: str = "sweep"  # baseline | sweep | refine | prefetch | batch_size | confirm

    @property
    def ok(self) -> bool:
        return self.status == "ok" and self.batches_per_s is not None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["label"] = self.setting.label()
        return d


@dataclass
class MeasureConfig:
    time_per_point: float = 1.5  # seconds of timed iteration per point, split over the repeats
    repeats: int = 3
    warmup_batches: int = 2
    max_batches_per_window: int | None = None
    limits: MemLimits = field(default_factory=MemLimits)


@dataclass
class TuneConfig:
    max_workers: int | None = None  # default: 4x usable cores, at most 64
    prefetch_factors: tuple[int, ...] = (2, 4)
    batch_sizes: tuple[int, ...] = ()  # also measure these batch sizes at the chosen setting
    patience: int = 2
    min_gain: float = 0.03
    confirm_rounds: int = 3
    measure: MeasureConfig = field(default_factory=MeasureConfig)
    ram_safety: float = 0.7  # a prediction above this share of available RAM / free shm is rejected


@dataclass
class LoaderTuneResult:
    baseline: LoaderSetting
    chosen: LoaderSetting
    points: list[LoaderPoint]
    findings: list[Finding]
    speedup: float | None  # chosen vs baseline, interleaved confirmation rounds (median)
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


# ---------------------------------------------------------------------------------------------- measuring


def batch_nbytes(batch: Any) -> int:
    """Bytes of tensor data in a batch (tensors inside tuples, lists and dicts)."""
    import torch

    if isinstance(batch, torch.Tensor):
        return batch.numel() * batch.element_size()
    if isinstance(batch, dict):
        return sum(batch_nbytes(v) for v in batch.values())
    if isinstance(batch, list | tuple):
        return sum(batch_nbytes(v) for v in batch)
    return 0


def batch_len(batch: Any) -> int | None:
    """Samples in a batch: the leading dimension of its first tensor."""
    import torch

    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else 1
    if isinstance(batch, dict):
        batch = list(batch.values())
    if isinstance(batch, list | tuple):
        for v in batch:
            n = batch_len(v)
            if n is not None:
                return n
    return None


def describe_failure(exc: BaseException) -> str:
    """One or two lines: the exception and, for worker errors, the original error at the end."""
    lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()]
    head = f"{type(exc).__name__}: {lines[0] if lines else ''}".strip()
    if len(lines) > 1 and lines[-1] != lines[0]:
        head += f" ... {lines[-1]}"
    return head[:400]


def is_worker_crash(reason: str) -> bool:
    return "DataLoader worker" in reason or "worker process" in reason


def make_loader(dataset: Any, base_kwargs: dict[str, Any], setting: LoaderSetting) -> Any:
    from torch.utils.data import DataLoader

    kw = {k: v for k, v in base_kwargs.items() if k not in TUNED_KEYS and k != "dataset"}
    kw.update(setting.kwargs())
    if setting.num_workers == 0:  # DataLoader rejects these without workers
        kw.pop("multiprocessing_context", None)
        kw.pop("worker_init_fn", None)
    if kw.get("batch_sampler") is not None:
        kw.pop("batch_size", None)
        for k in ("shuffle", "sampler", "drop_last"):
            kw.pop(k, None)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="This DataLoader will create")
        return DataLoader(dataset, **kw)


def measure_setting(
    dataset: Any,
    setting: LoaderSetting,
    base_kwargs: dict[str, Any] | None = None,
    config: MeasureConfig | None = None,
) -> LoaderPoint:
    """Time one DataLoader setting: start-up, warm-up, then ``repeats`` bounded windows of batches/s."""
    cfg = config or MeasureConfig()
    setting = setting.normalized()
    point = LoaderPoint(setting=setting)
    base_kwargs = base_kwargs or {}
    window_s = cfg.time_per_point / max(1, cfg.repeats)
    it: Iterator[Any] | None = None
    samples = 0
    try:
        with MemWatch(cfg.limits) as watch, warnings.catch_warnings():
            # The sweep goes past the core count on purpose; torch's advice about that is noise here.
            warnings.filterwarnings("ignore", message="This DataLoader will create")
            loader = make_loader(dataset, base_kwargs, setting)

            def fresh() -> Iterator[Any]:
                return iter(loader)

            t0 = time.perf_counter()
            it = fresh()
            first = next(it)
            point.first_batch_s = time.perf_counter() - t0
            point.batch_bytes = batch_nbytes(first)
            per_batch = batch_len(first)
            for _ in range(cfg.warmup_batches):
                if time.perf_counter() - t0 > cfg.time_per_point:
                    break  # batches so slow that warming up would eat the point's budget
                try:
                    next(it)
                except StopIteration:
                    it = fresh()
            for _ in range(cfg.repeats):
                if point.windows and time.perf_counter() - t0 > 3 * cfg.time_per_point:
                    break  # bounded time per point, even when one batch takes longer than a window
                n, paused = 0, 0.0
                start = time.perf_counter()
                while True:
                    if watch.tripped:
                        break
                    try:
                        b = next(it)
                    except StopIteration:
                        # Epoch boundary: steady-state rate excludes the restart; it is measured apart.
                        r0 = time.perf_counter()
                        it = fresh()
                        b = next(it)
                        paused += time.perf_counter() - r0
                    n += 1
                    samples += batch_len(b) or 0
                    elapsed = time.perf_counter() - start - paused
                    if elapsed >= window_s or (
                        cfg.max_batches_per_window and n >= cfg.max_batches_per_window
                    ):
                        break
                if watch.tripped:
                    break
                elapsed = max(time.perf_counter() - start - paused, 1e-9)
                point.windows.append(n / elapsed)
                point.batches += n
            if not watch.tripped and setting.num_workers > 0:
                uss = children_uss()
                point.worker_uss = int(statistics.mean(uss)) if uss else None
            watch.sample()
        point.peak_rss = watch.peak_rss
        point.peak_shm_growth = watch.peak_shm_growth
        if watch.tripped:
            point.status, point.reason = "rejected", f"stopped while running: {watch.reason}"
            point.windows = []
            return point
        point.batches_per_s = statistics.median(point.windows) if point.windows else None
        if point.batches_per_s is not None and per_batch:
            point.samples_per_s = point.batches_per_s * (samples / max(point.batches, 1))
    except KeyboardInterrupt:
        raise
    except Exception as e:  # the dataset's own failure or a worker crash: a finding, not a traceback
        point.status, point.reason = "failed", describe_failure(e)
    finally:
        it = None  # drop the iterator so its workers shut down before the next point
    return point


def measure_restart(
    dataset: Any, setting: LoaderSetting, base_kwargs: dict[str, Any] | None = None, repeats: int = 3
) -> float | None:
    """Median seconds from a new epoch's iter() to its first batch (worker start-up unless persistent)."""
    if setting.num_workers == 0:
        return None
    times: list[float] = []
    it: Iterator[Any] | None = None
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="This DataLoader will create")
            loader = make_loader(dataset, base_kwargs or {}, setting)
            it = iter(loader)
            next(it)
            for _ in range(repeats):
                t0 = time.perf_counter()
                it = iter(loader)
                next(it)
                times.append(time.perf_counter() - t0)
    except KeyboardInterrupt:
        raise
    except Exception:
        return None
    finally:
        it = None
    return statistics.median(times) if times else None


# ------------------------------------------------------------------------------------------ pickle check


class _TooBig(Exception):
    pass


class _CountingSink(io.RawIOBase):
    """A write-only file that counts bytes and gives up past a cap, so checking a big dataset is cheap."""

    def __init__(self, cap: int) -> None:
        self.n, self.cap = 0, cap

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        self.n += len(b)
        if self.n > self.cap:
            raise _TooBig
        return len(b)


def picklable(obj: Any, cap: int = 64 * MiB) -> tuple[bool, str]:
    """(True, '') if ``obj`` pickles (or is still pickling after ``cap`` bytes), else (False, why)."""
    try:
        pickle.Pickler(_CountingSink(cap), protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    except _TooBig:
        return True, ""
    except Exception as e:
        return False, f"{type(e).__name__}: {e}"
    return True, ""


def start_method(base_kwargs: dict[str, Any]) -> str:
    ctx = base_kwargs.get("multiprocessing_context")
    if ctx is not None:
        return ctx if isinstance(ctx, str) else str(ctx.get_start_method())
    import torch.multiprocessing as tmp

    return tmp.get_start_method(allow_none=True) or "fork"


# ---------------------------------------------------------------------------------------------- the tuner


MeasureFn = Callable[[LoaderSetting], LoaderPoint]
ProgressFn = Callable[[str], None]


def worker_candidates(max_workers: int) -> list[int]:
    ladder = [w for w in WORKER_LADDER if w <= max_workers]
    if max_workers not in ladder:
        ladder.append(max_workers)
    return sorted(ladder)


def predict_rejection(
    setting: LoaderSetting, measured: list[LoaderPoint], limits: MemLimits, safety: float
) -> str | None:
    """Reason this setting would exhaust RAM or /dev/shm, predicted from points already measured."""
    s = setting.normalized()
    if s.num_workers == 0:
        return None
    ok = [p for p in measured if p.ok]
    uss = [p.worker_uss for p in ok if p.worker_uss]
    per_worker = max(uss) if uss else None
    sized = [p.batch_bytes for p in ok if p.batch_bytes and p.setting.batch_size == s.batch_size]
    bbytes = max(sized) if sized else None
    if per_worker is not None:
        need = s.num_workers * per_worker + (s.num_workers * (s.prefetch_factor or 2) * (bbytes or 0))
        avail = ram_available(limits)
        if need > safety * avail:
            return (
                f"predicted {need / MiB:.0f} MiB for {s.num_workers} workers "
                f"({per_worker / MiB:.0f} MiB unique memory each, measured) > {safety:.0%} of "
                f"{avail / MiB:.0f} MiB available RAM"
            )
    if bbytes is not None:
        in_flight = s.num_workers * (s.prefetch_factor or 2) * bbytes
        free = shm_free(limits)
        if free is not None and in_flight > safety * free:
            return (
                f"predicted {in_flight / MiB:.0f} MiB of batches in flight in /dev/shm "
                f"({s.num_workers} workers x prefetch {s.prefetch_factor} x {bbytes / MiB:.1f} MiB per batch, "
                f"measured) > {safety:.0%} of {free / MiB:.0f} MiB free"
            )
    return None


class _Sweep:
    """Holds measured points (each setting measured once) and the running best."""

    def __init__(self, measure: MeasureFn, cfg: TuneConfig, progress: ProgressFn | None) -> None:
        self.measure, self.cfg, self.progress = measure, cfg, progress
        self.points: dict[LoaderSetting, LoaderPoint] = {}
        self.order: list[LoaderPoint] = []
        self.best: LoaderPoint | None = None

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
        return p

    def consider(self, p: LoaderPoint) -> bool:
        """Adopt ``p`` as best when it beats the best by min_gain. Returns whether it did."""
        if not p.ok:
            return False
        if self.best is None or p.batches_per_s > self.best.batches_per_s * (1 + self.cfg.min_gain):  # type: ignore[operator]
            self.best = p
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
) -> LoaderTuneResult:
    """Find the fastest DataLoader setting for ``dataset`` by measuring; ``base_kwargs`` is the script's own
    DataLoader(...) keywords (its num_workers etc. are the baseline), ``location`` its file:line.
    ``measure`` replaces the real
    measurement (tests); Ctrl-C returns what was measured so far with ``interrupted=True``.
    """
    cfg = config or TuneConfig()
    base_kwargs = dict(base_kwargs or {})
    baseline = setting_from_kwargs(base_kwargs)
    cores = usable_cores()
    max_w = cfg.max_workers if cfg.max_workers is not None else min(64, 4 * cores)
    findings: list[Finding] = []
    meta: dict[str, Any] = {"usable_cores": cores, "max_workers": max_w, "min_gain": cfg.min_gain}

    def real_measure(s: LoaderSetting) -> LoaderPoint:
        return measure_setting(dataset, s, base_kwargs, cfg.measure)

    sweep = _Sweep(measure or real_measure, cfg, progress)

    method = start_method(base_kwargs) if measure is None else "fork"
    meta["start_method"] = method
    if measure is None:
        ok_pickle, why = picklable(dataset)
        if not ok_pickle:
            if method == "fork":
                findings.append(
                    Finding(
                        id="tune.loader.unpicklable",
                        severity=Severity.INFO,
                        title="Dataset cannot be pickled: workers only work with the 'fork' start method",
                        evidence=f"pickle.dumps(dataset) failed: {why}. This Python starts workers with fork, "
                        "so they work here; spawn/forkserver (macOS, Python 3.14+ on Linux) would fail.",
                        data={"error": why, "start_method": method},
                        fix="Keep unpicklable members (open files, lambdas, locks, DB handles) out of the "
                        "dataset's __init__; open them lazily in __getitem__ or a worker_init_fn.",
                    )
                )
            else:
                max_w = 0
                findings.append(
                    Finding(
                        id="tune.loader.unpicklable",
                        severity=Severity.ERROR,
                        title="Dataset cannot be pickled, so DataLoader workers cannot start",
                        evidence=f"start method {method!r} pickles the dataset for each worker, and "
                        f"pickle.dumps(dataset) failed: {why}. Only num_workers=0 was measured.",
                        data={"error": why, "start_method": method},
                        fix="Make the dataset picklable: open files/handles lazily in __getitem__ or "
                        "worker_init_fn, replace lambdas with module-level functions.",
                    )
                )

    if measure is None and _is_iterable(dataset):
        findings.append(
            Finding(
                id="tune.loader.iterable",
                severity=Severity.INFO,
                title="IterableDataset: each worker runs its own copy of the iterator",
                evidence=f"{type(dataset).__name__} is an IterableDataset; batches/s with N workers counts "
                "what N iterators yield, which is only real throughput if the dataset splits its stream by "
                "torch.utils.data.get_worker_info() (otherwise every sample is loaded N times).",
                fix="Shard the stream by worker id in __iter__ before using the chosen num_workers.",
            )
        )

    interrupted = False
    chosen = baseline
    try:
        base_point = sweep.get(baseline, "baseline")
        if not base_point.ok and base_point.status == "failed" and baseline.num_workers == 0:
            findings.append(_dataset_failure(base_point))
            return LoaderTuneResult(baseline, baseline, sweep.order, findings, None, None, None, False, meta)
        sweep.consider(base_point)

        # 1. num_workers: climb the ladder with the script's other settings, stop when it stops rising.
        ladder = worker_candidates(max_w)
        template = replace(baseline, prefetch_factor=None)
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
        # 2. refine between the best and its ladder neighbours.
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
                    sweep.consider(sweep.get(replace(template, num_workers=w), "refine"))
        best = sweep.best
        # 3. prefetch depth at the best worker count.
        if best is not None and best.setting.num_workers > 0:
            for pf in cfg.prefetch_factors:
                sweep.consider(sweep.get(replace(best.setting, prefetch_factor=pf), "prefetch"))
        best = sweep.best
        chosen = best.setting if best is not None else baseline

        # 4. persistent_workers: the per-epoch worker start-up it saves, measured.
        if chosen.num_workers > 0 and not chosen.persistent_workers and measure is None:
            f = _persistent_finding(dataset, base_kwargs, chosen, best)
            if f is not None:
                findings.append(f)
                if f.data.get("recommend"):
                    chosen = replace(chosen, persistent_workers=True)

        # 5. batch sizes, if asked: reported, not chosen (batch size changes the optimisation too).
        for bs in cfg.batch_sizes:
            sweep.get(replace(chosen, batch_size=bs), "batch_size")
    except KeyboardInterrupt:
        interrupted = True
        if sweep.best is not None:
            chosen = sweep.best.setting

    if not interrupted:
        try:
            pin = _pin_memory_finding(base_kwargs, chosen, dataset if measure is None else None, cfg)
        except KeyboardInterrupt:
            interrupted = True
        else:
            findings.append(pin)
            if pin.data.get("recommend"):
                chosen = replace(chosen, pin_memory=True)

    # 6. confirm: baseline and chosen again, interleaved, for the speed-up.
    base_rate = chosen_rate = speedup = None
    if not interrupted:
        try:
            base_rate, chosen_rate, speedup = _confirm(sweep, baseline, chosen, cfg, progress, meta)
        except KeyboardInterrupt:
            interrupted = True
    if speedup is None:
        bp, cp = sweep.points.get(baseline.normalized()), sweep.points.get(chosen.normalized())
        if bp and cp and bp.ok and cp.ok:
            base_rate, chosen_rate = bp.batches_per_s, cp.batches_per_s
            speedup = chosen_rate / base_rate  # type: ignore[operator]

    findings.extend(_sweep_findings(sweep.order))
    findings.insert(0, _best_finding(baseline, chosen, base_rate, chosen_rate, speedup, location, cfg))
    meta["points_measured"] = sum(1 for p in sweep.order if not p.reason.startswith("predicted"))
    meta["exhaustive_worker_points"] = len(worker_candidates(max_w))
    return LoaderTuneResult(
        baseline, chosen, sweep.order, findings, speedup, base_rate, chosen_rate, interrupted, meta
    )


def _confirm(
    sweep: _Sweep,
    baseline: LoaderSetting,
    chosen: LoaderSetting,
    cfg: TuneConfig,
    progress: ProgressFn | None,
    meta: dict[str, Any],
) -> tuple[float | None, float | None, float | None]:
    if chosen.normalized() == baseline.normalized() or cfg.confirm_rounds <= 0:
        p = sweep.points.get(baseline.normalized())
        rate = p.batches_per_s if p and p.ok else None
        return rate, rate, 1.0 if rate else None
    base, best = [], []
    for r in range(cfg.confirm_rounds):
        if progress:
            progress(f"confirming: round {r + 1}/{cfg.confirm_rounds}, script's setting vs chosen")
        for s, out in ((baseline, base), (chosen, best)):
            p = sweep.measure(s.normalized())
            p.role = "confirm"
            if p.ok:
                out.append(p.batches_per_s)
    meta["confirm_batches_per_s"] = {"baseline": base, "chosen": best}
    if not base or not best:
        return None, None, None
    b, c = statistics.median(base), statistics.median(best)
    return b, c, c / b


def _dataset_failure(p: LoaderPoint) -> Finding:
    return Finding(
        id="tune.loader.dataset_error",
        severity=Severity.ERROR,
        title="The dataset fails to produce a batch even without workers",
        evidence=f"num_workers=0: {p.reason}",
        data={"reason": p.reason},
        fix="Fix the dataset's __getitem__/collate_fn error first; nothing else was measured.",
    )


def _sweep_findings(points: list[LoaderPoint]) -> list[Finding]:
    out = []
    crashed = [p for p in points if p.status == "failed"]
    if crashed:
        worker = [p for p in crashed if p.setting.num_workers > 0]
        first = crashed[0]
        out.append(
            Finding(
                id="tune.loader.worker_crash",
                severity=Severity.ERROR,
                title=f"DataLoader failed with {first.setting.label()}"
                + (" (in a worker process)" if worker and is_worker_crash(first.reason) else ""),
                evidence="; ".join(f"{p.setting.label()}: {p.reason}" for p in crashed[:3]),
                data={"failed": [{"setting": p.setting.label(), "reason": p.reason} for p in crashed]},
                fix="A worker that dies (segfault, killed for memory, os._exit) or raises takes the loader down. "
                "Run the dataset with num_workers=0 to see the error in the main process; check for "
                "non-fork-safe libraries (OpenCV threads, CUDA in workers) and per-worker memory.",
            )
        )
    rejected = [p for p in points if p.status == "rejected"]
    if rejected:
        out.append(
            Finding(
                id="tune.loader.memory",
                severity=Severity.WARN,
                title=f"{len(rejected)} setting(s) rejected: they would exhaust RAM or /dev/shm",
                evidence="; ".join(f"{p.setting.label()}: {p.reason}" for p in rejected[:3]),
                data={"rejected": [{"setting": p.setting.label(), "reason": p.reason} for p in rejected]},
                fix="Stay at or below the chosen worker count on this machine; to go higher, shrink per-worker "
                "memory (load lazily, avoid Python lists of objects) or enlarge /dev/shm (docker --shm-size).",
            )
        )
    return out


def _persistent_finding(
    dataset: Any, base_kwargs: dict[str, Any], chosen: LoaderSetting, best: LoaderPoint | None
) -> Finding | None:
    cold = measure_restart(dataset, replace(chosen, persistent_workers=False), base_kwargs)
    warm = measure_restart(dataset, replace(chosen, persistent_workers=True), base_kwargs)
    if cold is None or warm is None or best is None or not best.ok:
        return None
    saving = max(0.0, cold - warm)
    try:
        n_batches = len(make_loader(dataset, base_kwargs, chosen))
    except TypeError:
        n_batches = None
    epoch_s = n_batches / best.batches_per_s if n_batches and best.batches_per_s else None
    share = saving / (epoch_s + cold) if epoch_s else None
    recommend = saving > 0.005 and (share is None or share >= 0.01)
    epoch_txt = (
        f" = {100 * share:.1f}% of a {epoch_s:.2f} s epoch ({n_batches} batches)" if share is not None else ""
    )
    return Finding(
        id="tune.loader.persistent_workers",
        severity=Severity.INFO,
        title="persistent_workers=True saves worker start-up each epoch"
        if recommend
        else "persistent_workers makes no measurable difference here",
        evidence=f"new epoch to first batch: {cold * 1000:.0f} ms with fresh workers, {warm * 1000:.0f} ms "
        f"with persistent ones (median of 3, {chosen.num_workers} workers){epoch_txt}",
        data={"restart_s": cold, "persistent_restart_s": warm, "epoch_s": epoch_s, "recommend": recommend},
        est_saving_s=saving,
        fix="Pass persistent_workers=True." if recommend else "",
    )


def _pin_memory_finding(
    base_kwargs: dict[str, Any], chosen: LoaderSetting, dataset: Any, cfg: TuneConfig
) -> Finding:
    import torch

    if not torch.cuda.is_available():
        return Finding(
            id="tune.loader.pin_memory",
            severity=Severity.INFO,
            title="pin_memory not measured: no CUDA device",
            evidence="Pinned (page-locked) host memory only speeds up host-to-device copies; this process "
            "sees no CUDA device, so there is no copy to measure and pin_memory was left as the script set it "
            f"({bool(base_kwargs.get('pin_memory', False))}).",
            data={"measured": False},
        )
    if dataset is None:
        return Finding(id="tune.loader.pin_memory", severity=Severity.INFO, title="pin_memory not measured")
    from pitstop.tune.h2d import measure_h2d

    try:
        r = measure_h2d(next(iter(make_loader(dataset, base_kwargs, replace(chosen, pin_memory=False)))))
    except Exception as e:  # a dataset that fails was reported by the sweep already
        return Finding(
            id="tune.loader.pin_memory",
            severity=Severity.INFO,
            title="pin_memory not measured",
            evidence=f"could not time a copy: {describe_failure(e)}",
            data={"measured": False},
        )
    copy_saving = r["pageable_s"] - r["pinned_s"]
    evidence = (
        f"copy of one batch ({r['bytes'] / MiB:.1f} MiB) to {r['device']}: {r['pageable_s'] * 1000:.2f} ms "
        f"pageable, {r['pinned_s'] * 1000:.2f} ms pinned (median of {r['repeats']}, CUDA events)"
    )
    loader_cost = 0.0
    if copy_saving > r["pageable_s"] * cfg.min_gain:
        # Pinning is done by a thread in the training process: measure what it costs the loader.
        off = measure_setting(dataset, replace(chosen, pin_memory=False), base_kwargs, cfg.measure)
        on = measure_setting(dataset, replace(chosen, pin_memory=True), base_kwargs, cfg.measure)
        if off.ok and on.ok:
            loader_cost = max(0.0, 1 / on.batches_per_s - 1 / off.batches_per_s)  # type: ignore[operator]
            evidence += f"; the loader gives {on.batches_per_s:.1f} batches/s pinning vs {off.batches_per_s:.1f} without"
            r.update(loader_pinned_batches_per_s=on.batches_per_s, loader_batches_per_s=off.batches_per_s)
    net = copy_saving - loader_cost
    recommend = copy_saving > r["pageable_s"] * cfg.min_gain and net > 0
    return Finding(
        id="tune.loader.pin_memory",
        severity=Severity.WARN if recommend and not chosen.pin_memory else Severity.INFO,
        title="pin_memory=True speeds the host-to-device copy"
        if recommend
        else "pin_memory does not pay off here",
        evidence=evidence,
        data={"measured": True, "recommend": recommend, "net_saving_s": net, **r},
        est_saving_s=max(0.0, net),
        fix="Pass pin_memory=True and copy with .to(device, non_blocking=True)." if recommend else "",
    )


def kwargs_diff(baseline: LoaderSetting, chosen: LoaderSetting) -> dict[str, Any]:
    """The DataLoader keywords to change to go from the script's setting to the chosen one."""
    b, c = baseline.kwargs(), chosen.kwargs()
    return {k: v for k, v in c.items() if b.get(k, _DEFAULTS.get(k)) != v}


_DEFAULTS = {"num_workers": 0, "pin_memory": False, "prefetch_factor": None, "persistent_workers": False}


def _best_finding(
    baseline: LoaderSetting,
    chosen: LoaderSetting,
    base_rate: float | None,
    chosen_rate: float | None,
    speedup: float | None,
    location: str | None,
    cfg: TuneConfig,
) -> Finding:
    changes = kwargs_diff(baseline, chosen)
    data = {
        "baseline": baseline.label(),
        "chosen": chosen.label(),
        "changes": changes,
        "baseline_batches_per_s": base_rate,
        "chosen_batches_per_s": chosen_rate,
        "speedup": speedup,
    }
    if not changes:
        rate = f" ({base_rate:.1f} batches/s)" if base_rate else ""
        return Finding(
            id="tune.loader.best",
            severity=Severity.PASS,
            title="The script's DataLoader setting is already the fastest measured",
            evidence=f"{baseline.label()}{rate}; no other setting was {cfg.min_gain:.0%} faster",
            data=data,
        )
    code = "DataLoader(..., " + ", ".join(f"{k}={v!r}" for k, v in changes.items()) + ")"
    if speedup is not None and base_rate and chosen_rate:
        ev = (
            f"{chosen_rate:.1f} vs {base_rate:.1f} batches/s ({speedup:.2f}x), median of "
            f"{cfg.confirm_rounds} interleaved rounds, {chosen.label()} vs the script's {baseline.label()}"
        )
    else:
        ev = f"{chosen.label()} vs the script's {baseline.label()} (speed-up not confirmed)"
    gain = speedup is not None and speedup >= 1 + cfg.min_gain
    return Finding(
        id="tune.loader.best",
        severity=Severity.WARN if gain else Severity.INFO,
        title=f"Use {chosen.label()}" + (f": {speedup:.2f}x faster loading" if speedup else ""),
        evidence=ev,
        data=data,
        fix="Change the DataLoader arguments.",
        fix_code=code,
        share=None if not speedup or speedup <= 0 else max(0.0, 1 - 1 / speedup),
        location=location,
    )


def sweep_rows(result: LoaderTuneResult) -> list[list[Any]]:
    rows = []
    for p in result.points:
        rows.append(
            [
                p.setting.label(),
                p.role,
                p.status,
                None if p.batches_per_s is None else round(p.batches_per_s, 2),
                None if p.samples_per_s is None else round(p.samples_per_s, 1),
                None if p.first_batch_s is None else round(p.first_batch_s, 3),
                None if p.peak_rss is None else round(p.peak_rss / MiB),
                p.reason,
            ]
        )
    return rows


SWEEP_HEADERS = [
    "setting",
    "phase",
    "status",
    "batches/s",
    "samples/s",
    "first batch s",
    "peak RSS MiB",
    "note",
]


def worker_curve(result: LoaderTuneResult) -> tuple[list[float], list[float]]:
    """(num_workers, batches/s) of the worker sweep points, sorted, for the plot."""
    pts = {}
    for p in result.points:
        if (
            p.ok
            and p.role in ("baseline", "sweep", "refine")
            and p.setting.batch_size == result.baseline.batch_size
        ) and (p.setting.prefetch_factor in (None, DEFAULT_PREFETCH) or p.setting.num_workers == 0):
            pts.setdefault(p.setting.num_workers, p.batches_per_s)
    xs = sorted(pts)
    return [float(x) for x in xs], [float(pts[x]) for x in xs]  # type: ignore[arg-type]


def finite(v: float | None) -> bool:
    return v is not None and math.isfinite(v)


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
