"""Largest batch size that fits, by doubling then bisection, with throughput at each size.

Fits means: a few full training steps (forward, backward, optimizer step) at that size run without an
out-of-memory error and their peak memory stays inside the budget. On CUDA the peak is
``torch.cuda.max_memory_allocated`` and an OOM (``torch.cuda.OutOfMemoryError``) is caught and cleaned
up (references dropped, ``empty_cache``). On CPU, which keeps no allocator statistics, the peak is the
live tensor bytes of the size's batch and first step (``pitstop.train.memory.TensorMemoryTracker``).
A size whose peak, extrapolated from the sizes already measured, would exceed the budget is not run at
all, so a CPU search never pushes the machine past it. Peaks are growth over the memory held after one
warm-up step at batch size 2 (model, optimizer state), so the budget is what a training step may add. The model and optimizer are restored
to their state before the search. The search has a time budget (``TIME_BUDGET_S`` unless told otherwise,
on every device): a size that would not finish in time is not started, and the sizes measured are kept.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from pitstop.findings import Finding, Severity
from pitstop.measure.clock import Stopwatch
from pitstop.tune.batch_meters import CpuMeter, CudaMeter, is_oom
from pitstop.tune.steps import SavedState, default_loss, model_device, train_step
from pitstop.units import MiB

if TYPE_CHECKING:
    from pitstop.train.trainer import ComputeLoss

BatchFn = Callable[[int], Any]
TIME_BUDGET_S = 120.0  # the search's default time bound, on every device (a CPU doubles for minutes)


@dataclass
class BatchTrial:
    batch_size: int
    status: str  # fits | over_budget | oom | predicted_over | failed
    peak_bytes: int | None = None  # peak memory growth over the start of the search
    step_s: float | None = None  # median timed step
    samples_per_s: float | None = None
    reason: str = ""

    @property
    def fits(self) -> bool:
        return self.status == "fits"


@dataclass
class BatchSizeResult:
    best: int | None
    budget_bytes: int
    device: str
    memory_measure: str  # what peak_bytes is: CudaMeter.name or CpuMeter.name
    trials: list[BatchTrial] = field(default_factory=list)
    interrupted: bool = False
    time_budget_s: float | None = None  # the search's time bound (None: none)
    out_of_time: int | None = None  # the size not started because the time budget would not hold it

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["trials"] = [asdict(t) for t in self.trials]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> BatchSizeResult:
        d = dict(d)
        d["trials"] = [BatchTrial(**t) for t in d.get("trials", [])]
        return cls(**d)


def dataset_batch_fn(dataset: Any, collate_fn: Callable[[list[Any]], Any] | None = None) -> BatchFn:
    """Batches of any size from a map-style dataset (samples repeat if the dataset is smaller)."""
    from torch.utils.data import default_collate

    collate = collate_fn or default_collate
    n = len(dataset)

    def make(bs: int) -> Any:
        return collate([dataset[i % n] for i in range(bs)])

    return make


# -------------------------------------------------------------------------------------------------- search


def default_budget(device: Any) -> int:
    import psutil
    import torch

    if getattr(device, "type", str(device)) == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(0.9 * free)
    return int(0.5 * psutil.virtual_memory().available)


def _predict(trials: list[BatchTrial], bs: int) -> float | None:
    """Peak at ``bs`` extrapolated linearly from the two largest sizes that fitted."""
    fit = sorted((t for t in trials if t.fits and t.peak_bytes is not None), key=lambda t: t.batch_size)
    if len(fit) < 2:
        return None
    a, b = fit[-2], fit[-1]
    if bs <= b.batch_size:
        return None
    slope = max(0.0, (b.peak_bytes - a.peak_bytes) / (b.batch_size - a.batch_size))  # type: ignore[operator]
    return b.peak_bytes + slope * (bs - b.batch_size)  # type: ignore[operator]


def find_batch_size(
    model: Any,
    batch_fn: BatchFn,
    optimizer: Any | None = None,
    loss_fn: ComputeLoss | None = None,
    *,
    budget_bytes: int | None = None,
    start: int = 2,
    max_batch_size: int = 65536,
    steps: int = 3,
    tolerance: float = 1 / 32,
    progress: Callable[[str], None] | None = None,
    meter: CpuMeter | CudaMeter | None = None,
    time_budget_s: float | None = TIME_BUDGET_S,
    on_trial: Callable[[BatchSizeResult], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> BatchSizeResult:
    """Doubling from ``start`` until a size does not fit, then bisection down to ``tolerance`` of the size.

    ``batch_fn(bs)`` returns a batch of ``bs`` samples; ``steps`` training steps run per size (the first is
    a warm-up, the rest are timed). ``optimizer`` defaults to SGD (no state); pass the real one, since
    Adam's state is memory too. The search ends within ``time_budget_s`` (None: no bound): a size whose
    trial, scaled from the last one's time, would not finish in what is left is not started
    (``out_of_time``). Ctrl-C stops the search; either way the result holds what was measured, and
    ``on_trial`` gets it after every size.
    """
    import torch

    from pitstop.train.prefetch import move_to

    loss_fn = loss_fn or default_loss
    device = model_device(model)
    if optimizer is None:
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-9)
    saved = SavedState(model, optimizer)
    model.train()
    # One step at batch size 2 first (1 would trip BatchNorm in training mode), so one-time costs (kernel
    # libraries, optimizer state, allocator pools) are part of the origin, not charged to the first size.
    warm_error = None
    try:
        train_step(model, optimizer, move_to(batch_fn(2), device, non_blocking=True), loss_fn).item()
    except KeyboardInterrupt:
        saved.restore()
        raise
    except Exception as e:
        warm_error = e
    optimizer.zero_grad(set_to_none=True)
    if meter is None:  # tests pass their own
        meter = CudaMeter(device) if device.type == "cuda" else CpuMeter(model, optimizer)
    budget = int(budget_bytes) if budget_bytes else default_budget(device)
    result = BatchSizeResult(None, budget, str(device), meter.name, time_budget_s=time_budget_s)
    if warm_error is not None and not is_oom(warm_error):
        saved.restore()
        msg = str(warm_error).splitlines()[0][:200] if str(warm_error) else ""
        result.trials.append(BatchTrial(2, "failed", reason=f"{type(warm_error).__name__}: {msg}"))
        return result
    search = _Search(
        model, optimizer, batch_fn, loss_fn, meter, result, max(1, steps), progress, on_trial, clock
    )
    try:
        search.run(max(1, start), max_batch_size, tolerance)
    except KeyboardInterrupt:
        result.interrupted = True
    except _OutOfTime:
        pass
    finally:
        saved.restore()
        meter.cleanup()
    result.best = search.lo or None
    return result


class _OutOfTime(Exception):
    """The next size would not finish inside the time budget."""


class _Search:
    """The doubling / bisection over sizes, each size one ``trial``, inside the result's time budget."""

    def __init__(
        self,
        model: Any,
        optimizer: Any,
        batch_fn: BatchFn,
        loss_fn: ComputeLoss,
        meter: CpuMeter | CudaMeter,
        result: BatchSizeResult,
        steps: int,
        progress: Callable[[str], None] | None,
        on_trial: Callable[[BatchSizeResult], None] | None,
        clock: Callable[[], float],
    ) -> None:
        self.model, self.optimizer, self.batch_fn, self.loss_fn = model, optimizer, batch_fn, loss_fn
        self.meter, self.result, self.steps, self.progress, self.on_trial = (
            meter,
            result,
            steps,
            progress,
            on_trial,
        )
        self.clock, self.start = clock, clock()
        self.lo = 0
        self.last: tuple[int, float] | None = None  # (size, seconds) of the last trial that ran

    def trial(self, bs: int) -> BatchTrial:
        """Measure size ``bs`` (or predict it over the memory budget), add it to the result."""
        r = self.result
        pred = _predict(r.trials, bs)
        if pred is not None and pred > r.budget_bytes:
            t = BatchTrial(
                bs, "predicted_over", int(pred), reason=f"predicted peak {pred / MiB:.0f} MiB > budget"
            )
        else:
            self._check_time(bs)
            if self.progress:
                self.progress(f"batch size {bs}")
            t0 = self.clock()
            t = _measure(self, bs)
            self.last = (bs, self.clock() - t0)
        r.trials.append(t)
        if self.on_trial:
            self.on_trial(r)
        return t

    def _check_time(self, bs: int) -> None:
        """Raise ``_OutOfTime`` when size ``bs``, timed as the last size scaled by the batch, would end
        past the time budget (the first size always runs)."""
        budget = self.result.time_budget_s
        if budget is None or self.last is None:
            return
        size, took = self.last
        left = budget - (self.clock() - self.start)
        if took * max(1.0, bs / size) > left:
            self.result.out_of_time = bs
            raise _OutOfTime

    def run(self, bs: int, max_batch_size: int, tolerance: float) -> None:
        trials = self.result.trials
        for _ in range(
            4
        ):  # a re-checked edge that fits restarts the doubling above it (rarely more than once)
            hi = None
            while bs <= max_batch_size:
                t = self.trial(bs)
                if t.status == "failed":
                    return
                if not t.fits:
                    hi = bs
                    break
                self.lo, bs = bs, bs * 2
            if hi is None or self.lo == 0:
                return
            while hi - self.lo > max(1, int(self.lo * tolerance)):
                mid = (self.lo + hi) // 2
                t = self.trial(mid)
                if t.status == "failed":
                    return
                self.lo, hi = (mid, hi) if t.fits else (self.lo, mid)
            # The edge may be a size that was only predicted not to fit, from an extrapolation made before
            # the sizes near it were measured: re-predict with them, and measure it if it may fit now.
            edge = next((t for t in reversed(trials) if t.batch_size == hi), None)
            if edge is None or edge.status != "predicted_over":
                return
            pred = _predict(trials, hi)
            if pred is None or pred > self.result.budget_bytes or not self.trial(hi).fits:
                return
            self.lo, bs = hi, hi * 2


def _measure(s: _Search, bs: int) -> BatchTrial:
    """Run ``s.steps`` training steps at size ``bs``: its peak memory, median step and throughput."""
    from pitstop.train.prefetch import move_to

    device = model_device(s.model)
    t = BatchTrial(bs, "fits")
    times: list[float] = []
    s.meter.reset()
    batch = None

    def timed_step() -> float:
        step = Stopwatch()
        # .item() completes the step (CUDA), so the timing is the step's
        train_step(s.model, s.optimizer, batch, s.loss_fn).item()
        return step.elapsed()

    try:
        # Memory is taken over the batch and the first (warm-up) step, which allocate what every step
        # does; the later steps are timed outside the CPU tracker, whose per-op bookkeeping costs time.
        with s.meter.track():
            batch = move_to(s.batch_fn(bs), device, non_blocking=True)
            first = timed_step()
        times = [timed_step() for _ in range(s.steps - 1)] or [first]
    except KeyboardInterrupt:
        raise
    except Exception as e:
        reason = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
        t.status, t.reason = ("oom" if is_oom(e) else "failed"), reason
    # Outside the except block, so the exception's frames (holding the step's tensors) are gone.
    batch = None
    s.optimizer.zero_grad(set_to_none=True)
    t.peak_bytes = s.meter.peak()
    s.meter.cleanup(full=t.status != "fits")
    if t.status == "fits":
        if t.peak_bytes > s.result.budget_bytes:
            t.status, t.reason = "over_budget", f"peak {t.peak_bytes / MiB:.0f} MiB > budget"
        if times:
            t.step_s = statistics.median(times)
            t.samples_per_s = bs / t.step_s
    return t


def cut_short(result: BatchSizeResult) -> str:
    """What ended the search before its limit was found ("" when nothing did)."""
    if result.out_of_time is not None:
        return (
            f"the search stopped at its {result.time_budget_s:.0f} s time budget before batch size "
            f"{result.out_of_time}"
        )
    return "the search was interrupted (Ctrl-C or SIGTERM)" if result.interrupted else ""


def batch_size_findings(result: BatchSizeResult) -> list[Finding]:
    fits = [t for t in result.trials if t.fits]
    failed = [t for t in result.trials if t.status == "failed"]
    out: list[Finding] = []
    if failed:
        out.append(
            Finding(
                id="tune.batch_size.error",
                severity=Severity.ERROR,
                title=f"Training step failed at batch size {failed[0].batch_size}",
                evidence=failed[0].reason,
                data={"batch_size": failed[0].batch_size, "reason": failed[0].reason},
                fix="Check the loss function and the batch format (pass --loss pkg.mod:fn).",
            )
        )
    if result.best is None:
        if not failed:
            t = result.trials[0] if result.trials else None
            out.append(
                Finding(
                    id="tune.batch_size.best",
                    severity=Severity.ERROR,
                    title="Not even the smallest batch size fits the budget",
                    evidence=f"batch size {t.batch_size}: {t.reason}" if t else "nothing measured",
                    data={"budget_bytes": result.budget_bytes},
                    fix="Raise the budget, shrink the model, or use activation checkpointing / mixed precision.",
                )
            )
        return out
    best = next(t for t in fits if t.batch_size == result.best)
    top = max(fits, key=lambda t: t.samples_per_s or 0.0)
    out.append(_best_finding(result, best))
    if (
        top.batch_size != result.best
        and top.samples_per_s
        and best.samples_per_s
        and (top.samples_per_s > 1.1 * best.samples_per_s)
    ):
        out.append(
            Finding(
                id="tune.batch_size.throughput",
                severity=Severity.INFO,
                title=f"Highest throughput at batch size {top.batch_size}, not the largest",
                evidence=f"{top.samples_per_s:.1f} samples/s at {top.batch_size} vs {best.samples_per_s:.1f} at "
                f"{result.best} (median of timed steps)",
                data={"batch_size": top.batch_size, "samples_per_s": top.samples_per_s},
            )
        )
    return out


def _best_finding(result: BatchSizeResult, best: BatchTrial) -> Finding:
    """``tune.batch_size.best`` for a search whose largest fitting size was ``best``: the first size that
    did not fit, or what ended the search before one was found."""
    fit_sizes = {t.batch_size for t in result.trials if t.fits}
    first_bad = min(
        (t for t in result.trials if not t.fits and t.status != "failed" and t.batch_size not in fit_sizes),
        key=lambda t: t.batch_size,
        default=None,
    )
    cut = cut_short(result)
    if first_bad:
        bad_txt = f"; batch size {first_bad.batch_size}: {first_bad.status.replace('_', ' ')}" + (
            f" ({first_bad.reason})" if first_bad.reason else ""
        )
    else:
        bad_txt = f"; {cut}" if cut else " (the search reached its maximum)"
    more = (
        " Larger sizes were not tried: give the search more time (--time-budget)."
        if result.out_of_time
        else ""
    )
    return Finding(
        id="tune.batch_size.best",
        severity=Severity.INFO,
        title=f"Largest batch size {'measured to fit' if cut else 'that fits'}: {result.best}",
        evidence=f"batch size {result.best}: peak {best.peak_bytes / MiB:.0f} MiB ({result.memory_measure}) of a "
        f"{result.budget_bytes / MiB:.0f} MiB budget on {result.device}, "
        f"{best.samples_per_s or 0:.1f} samples/s{bad_txt}",
        data={
            "best": result.best,
            "budget_bytes": result.budget_bytes,
            "peak_bytes": best.peak_bytes,
            "samples_per_s": best.samples_per_s,
        },
        fix="Batch sizes up to this fit; scale the learning rate with the batch size if you change it."
        + more,
    )
