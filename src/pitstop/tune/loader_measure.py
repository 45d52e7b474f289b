"""Measuring one DataLoader setting on the user's dataset: batches/s over bounded windows, time to the first
batch of a new epoch, per-worker memory and batch size, and whether the dataset pickles for workers.

A fresh DataLoader is built per setting with the script's other arguments (collate_fn, sampler, ...),
warmed up, then timed over ``repeats`` windows of bounded length; the point's rate is its throughput, the
batches of all windows over their seconds (an epoch's restart is left out: it is measured apart, for
``persistent_workers``).
RAM and /dev/shm are watched while it runs (memwatch). ``TuneConfig`` holds the settings of the search
(``loader``) around it, which ``loader_findings`` and ``loader_knobs`` read too.
"""

from __future__ import annotations

import io
import pickle
import statistics
import warnings
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from pitstop.measure.clock import Stopwatch
from pitstop.recipes import dataloader
from pitstop.tune.memwatch import MemLimits, MemWatch, children_uss, ram_available, shm_free
from pitstop.units import MiB

OWN_KEYS = dataloader.TUNER_KEYS  # the tuner's own two, beside the loader components' keywords
# DataLoader arguments the tuner sets (``pitstop.recipes.dataloader.KEYS``); everything else the script
# passed is kept as it was.
TUNED_KEYS = dataloader.KEYS
DEFAULT_PREFETCH = 2  # torch's default when num_workers > 0


@dataclass(frozen=True)
class LoaderSetting:
    """One DataLoader setting the tuner measures: a field per loader component's ``KEY`` (its value) and
    the tuner's own keywords, ``batch_size`` and ``prefetch_factor``."""

    num_workers: int = 0
    batch_size: int | None = 1  # None when the loader uses a batch_sampler
    prefetch_factor: int | None = None  # ignored (None) when num_workers == 0
    persistent_workers: bool = False
    pin_memory: bool = False

    def normalized(self) -> LoaderSetting:
        """Without workers, the keywords that need them at their defaults; with workers, a prefetch
        factor (torch's default where none is set)."""
        if self.num_workers == 0:
            reset = {c.KEY: c.DEFAULT for c in dataloader.SETTINGS if c.NEEDS_WORKERS}
            return replace(self, prefetch_factor=None, **reset)
        return replace(self, prefetch_factor=self.prefetch_factor or DEFAULT_PREFETCH)

    def of(self, comp: dataloader.LoaderKeyword) -> Any:
        """The value this setting gives the loader component ``comp``'s keyword."""
        return getattr(self, comp.KEY)

    def with_value(self, comp: dataloader.LoaderKeyword, value: Any) -> LoaderSetting:
        """This setting with ``comp``'s keyword at ``value``."""
        return replace(self, **{comp.KEY: value})

    def kwargs(self) -> dict[str, Any]:
        """The DataLoader keywords of this setting: each loader component's, through its
        ``apply_loader_kwargs`` (which leaves out one that needs workers where there are none), the batch
        size and, with workers, the prefetch factor. In the order the report's ``chosen_kwargs`` has:
        the keywords valid without workers first, then those that need them."""
        s = self.normalized()
        forced = {c.KEY: s.of(c) for c in dataloader.SETTINGS}
        d: dict[str, Any] = {}
        for c in dataloader.SETTINGS:
            if not c.NEEDS_WORKERS:
                d = c.apply_loader_kwargs(d, forced)[0]
        if s.batch_size is not None:
            d["batch_size"] = s.batch_size
        if s.num_workers > 0:
            d["prefetch_factor"] = s.prefetch_factor
        for c in dataloader.SETTINGS:
            if c.NEEDS_WORKERS:
                d = c.apply_loader_kwargs(d, forced)[0]
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
    """The setting a script's own DataLoader(...) call used (torch defaults for what it left out: each
    loader component's ``value``)."""
    bs = None if kwargs.get("batch_sampler") is not None else kwargs.get("batch_size", 1)
    own = {c.KEY: c.value(kwargs.get(c.KEY)) for c in dataloader.SETTINGS}
    return LoaderSetting(batch_size=bs, prefetch_factor=kwargs.get("prefetch_factor"), **own).normalized()


@dataclass
class LoaderPoint:
    """One measured setting. Rates are throughput: batches over the seconds of all its timed windows (a
    slow batch counts as the clock saw it); memory is growth while it ran."""

    setting: LoaderSetting
    status: str = "ok"  # ok | rejected (memory) | failed (exception / worker crash)
    reason: str = ""
    batches_per_s: float | None = None
    samples_per_s: float | None = None
    windows: list[float] = field(default_factory=list)  # batches/s of each timed window
    batches: int = 0
    seconds: float = 0.0  # timed seconds of those windows: batches / seconds is the point's throughput
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
    max_workers: int | None = None  # default: one ladder rung past recipes.workers' cap
    prefetch_factors: tuple[int, ...] = (2, 4)
    batch_sizes: tuple[int, ...] = ()  # also measure these batch sizes at the chosen setting
    patience: int = 2
    min_gain: float = 0.03
    confirm_rounds: int = 3
    measure: MeasureConfig = field(default_factory=MeasureConfig)
    ram_safety: float = 0.7  # a prediction above this share of available RAM / free shm is rejected


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


@dataclass
class _Batches:
    """One setting's batches: the iterator over its loader, started again at each epoch's end, and the
    samples the measured windows read."""

    loader: Any = None
    it: Iterator[Any] | None = None
    samples: int = 0

    def fresh(self) -> None:
        self.it = iter(self.loader)

    def next(self) -> Any:
        return next(self.it)  # type: ignore[arg-type]  # fresh() comes first


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
    batches = _Batches()
    try:
        with MemWatch(cfg.limits) as watch, warnings.catch_warnings():
            # The sweep goes past the core count on purpose; torch's advice about that is noise here.
            warnings.filterwarnings("ignore", message="This DataLoader will create")
            batches.loader = make_loader(dataset, base_kwargs, setting)
            point_clock = Stopwatch()  # the point's own time, for its budget
            batches.fresh()
            first = batches.next()
            point.first_batch_s = point_clock.elapsed()
            point.batch_bytes = batch_nbytes(first)
            per_batch = batch_len(first)
            _warm_up(batches, cfg, point_clock)
            _measure_windows(batches, point, watch, cfg, point_clock)
            if not watch.tripped and setting.num_workers > 0:
                uss = children_uss()
                point.worker_uss = int(statistics.mean(uss)) if uss else None
            watch.sample()
        _settle(point, watch, per_batch, batches.samples)
    except KeyboardInterrupt:
        raise
    except Exception as e:  # the dataset's own failure or a worker crash: a finding, not a traceback
        point.status, point.reason = "failed", describe_failure(e)
    finally:
        batches.it = None  # drop the iterator so its workers shut down before the next point
    return point


def _warm_up(batches: _Batches, cfg: MeasureConfig, point_clock: Stopwatch) -> None:
    """Read ``cfg.warmup_batches`` batches before measuring, unless they would eat the point's budget."""
    for _ in range(cfg.warmup_batches):
        if point_clock.elapsed() > cfg.time_per_point:
            break  # batches so slow that warming up would eat the point's budget
        try:
            batches.next()
        except StopIteration:
            batches.fresh()


def _measure_windows(
    batches: _Batches, point: LoaderPoint, watch: MemWatch, cfg: MeasureConfig, point_clock: Stopwatch
) -> None:
    """Up to ``cfg.repeats`` windows of batches/s into ``point`` (windows, batches, seconds); stops
    when the memory watch trips or the point has run three times its time budget."""
    window_s = cfg.time_per_point / max(1, cfg.repeats)
    for _ in range(cfg.repeats):
        if point.windows and point_clock.elapsed() > 3 * cfg.time_per_point:
            break  # bounded time per point, even when one batch takes longer than a window
        n = 0
        window = Stopwatch()
        while True:
            if watch.tripped:
                break
            try:
                b = batches.next()
            except StopIteration:
                # Epoch boundary: steady-state rate excludes the restart; it is measured apart.
                with window.paused():
                    batches.fresh()
                    b = batches.next()
            n += 1
            batches.samples += batch_len(b) or 0
            elapsed = window.elapsed()
            if elapsed >= window_s or (cfg.max_batches_per_window and n >= cfg.max_batches_per_window):
                break
        if watch.tripped:
            break
        elapsed = max(window.elapsed(), 1e-9)
        point.windows.append(n / elapsed)
        point.batches += n
        point.seconds += elapsed


def _settle(point: LoaderPoint, watch: MemWatch, per_batch: int | None, samples: int) -> None:
    """The point's memory peaks and rates; a tripped memory watch rejects it instead, windows dropped."""
    point.peak_rss = watch.peak_rss
    point.peak_shm_growth = watch.peak_shm_growth
    if watch.tripped:
        point.status, point.reason = "rejected", f"stopped while running: {watch.reason}"
        point.windows = []
        return
    point.batches_per_s = point.batches / point.seconds if point.windows and point.seconds > 0 else None
    if point.batches_per_s is not None and per_batch:
        point.samples_per_s = point.batches_per_s * (samples / max(point.batches, 1))


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
                # rebinding ``it`` drops the old iterator in here (its workers shut down unless persistent)
                restart = Stopwatch()
                it = iter(loader)
                next(it)
                times.append(restart.elapsed())
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
