"""Largest batch size that fits, by doubling then bisection, with throughput at each size.

Fits means: a few full training steps (forward, backward, optimizer step) at that size run without an
out-of-memory error and their peak memory stays inside the budget. On CUDA the peak is
``torch.cuda.max_memory_allocated`` and an OOM (``torch.cuda.OutOfMemoryError``) is caught and cleaned
up (references dropped, ``empty_cache``). On CPU, which keeps no allocator statistics, the peak is the
live tensor bytes of the size's batch and first step (``pitstop.train.memory.TensorMemoryTracker``).
A size whose peak, extrapolated from the sizes already measured, would exceed the budget is not run at
all, so a CPU search never pushes the machine past it. Peaks are growth over the memory held after one
warm-up step at batch size 2 (model, optimizer state), so the budget is what a training step may add. The model and optimizer are restored
to their state before the search.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from pitstop.findings import Finding, Severity
from pitstop.tune.steps import SavedState, default_loss, model_device, train_step
from pitstop.units import MiB

if TYPE_CHECKING:
    from pitstop.train.trainer import ComputeLoss

BatchFn = Callable[[int], Any]


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

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["trials"] = [asdict(t) for t in self.trials]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> BatchSizeResult:
        d = dict(d)
        d["trials"] = [BatchTrial(**t) for t in d.get("trials", [])]
        return cls(**d)


# ------------------------------------------------------------------------------------------- memory meters


def _malloc_trim() -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


class CpuMeter:
    """Peak live tensor bytes of a size's first step, from a tensor tracker (deterministic).

    The process RSS high-water mark was tried first and was not usable: glibc's adaptive mmap threshold
    and heap fragmentation moved the same size's reading by 2x between runs, so the answer did too.
    The tracker counts every storage an op creates until it is freed; allocator overhead and C++
    scratch buffers are not included, which the default budget (half of available RAM) leaves room for.
    """

    name = "peak live tensor memory (CPU tensor tracker)"

    def __init__(self, model: Any = None, optimizer: Any = None) -> None:
        self._preexisting = _state_tensors(model, optimizer)
        self._tracker: Any = None

    def reset(self) -> None:
        self._tracker = None

    @contextlib.contextmanager
    def track(self) -> Iterator[None]:
        from pitstop.train.memory import TensorMemoryTracker

        with TensorMemoryTracker(self._preexisting) as tracker:
            self._tracker = tracker
            yield

    def peak(self) -> int:
        t = self._tracker
        return 0 if t is None else max(0, t.peak_bytes - t.baseline_bytes)

    def cleanup(self, full: bool = False) -> None:
        if full:  # after an OOM: frames and cycles may still hold the step's tensors
            gc.collect()
        _malloc_trim()  # hand a large size's freed heap back to the system


def _state_tensors(model: Any, optimizer: Any) -> list[Any]:
    """Parameters, buffers and optimizer state: memory held before a size's step starts."""
    import torch

    out: list[Any] = []
    if model is not None:
        out += list(model.parameters()) + list(model.buffers())
    if optimizer is not None:
        for state in optimizer.state.values():
            out += [v for v in state.values() if isinstance(v, torch.Tensor)]
    return out


class CudaMeter:
    """Growth of ``torch.cuda.max_memory_allocated`` over all of a size's steps."""

    name = "cuda max_memory_allocated"

    def __init__(self, device: Any) -> None:
        import torch

        self.device = device
        torch.cuda.synchronize(device)
        self.origin = torch.cuda.memory_allocated(device)

    def reset(self) -> None:
        import torch

        torch.cuda.reset_peak_memory_stats(self.device)

    @contextlib.contextmanager
    def track(self) -> Iterator[None]:
        yield  # the allocator keeps the peak by itself

    def peak(self) -> int:
        import torch

        return max(0, torch.cuda.max_memory_allocated(self.device) - self.origin)

    def cleanup(self, full: bool = False) -> None:
        import torch

        if full:
            gc.collect()
        torch.cuda.empty_cache()


def is_oom(exc: BaseException) -> bool:
    import torch

    if isinstance(exc, torch.cuda.OutOfMemoryError | MemoryError):
        return True
    return isinstance(exc, RuntimeError) and (
        "out of memory" in str(exc).lower() or "can't allocate memory" in str(exc).lower()
    )


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
) -> BatchSizeResult:
    """Doubling from ``start`` until a size does not fit, then bisection down to ``tolerance`` of the size.

    ``batch_fn(bs)`` returns a batch of ``bs`` samples; ``steps`` training steps run per size (the first is
    a warm-up, the rest are timed). ``optimizer`` defaults to SGD (no state); pass the real one, since
    Adam's state is memory too. Ctrl-C stops the search with what was measured.
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
    result = BatchSizeResult(None, budget, str(device), meter.name)
    if warm_error is not None and not is_oom(warm_error):
        saved.restore()
        msg = str(warm_error).splitlines()[0][:200] if str(warm_error) else ""
        result.trials.append(BatchTrial(2, "failed", reason=f"{type(warm_error).__name__}: {msg}"))
        return result

    def trial(bs: int) -> BatchTrial:
        pred = _predict(result.trials, bs)
        if pred is not None and pred > budget:
            return BatchTrial(
                bs, "predicted_over", int(pred), reason=f"predicted peak {pred / MiB:.0f} MiB > budget"
            )
        if progress:
            progress(f"batch size {bs}")
        t = BatchTrial(bs, "fits")
        oom = False
        times: list[float] = []
        meter.reset()
        batch = None

        def timed_step() -> float:
            t0 = time.perf_counter()
            # .item() completes the step (CUDA), so the timing is the step's
            train_step(model, optimizer, batch, loss_fn).item()
            return time.perf_counter() - t0

        try:
            # Memory is taken over the batch and the first (warm-up) step, which allocate what every step
            # does; the later steps are timed outside the CPU tracker, whose per-op bookkeeping costs time.
            with meter.track():
                batch = move_to(batch_fn(bs), device, non_blocking=True)
                first = timed_step()
            times = [timed_step() for _ in range(max(1, steps) - 1)] or [first]
        except KeyboardInterrupt:
            raise
        except Exception as e:
            if is_oom(e):
                oom = True
                t.status, t.reason = "oom", f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
            else:
                t.status, t.reason = (
                    "failed",
                    f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}",
                )
        # Outside the except block, so the exception's frames (holding the step's tensors) are gone.
        batch = None
        optimizer.zero_grad(set_to_none=True)
        t.peak_bytes = meter.peak()
        meter.cleanup(full=t.status != "fits")
        if not oom and t.status == "fits":
            if t.peak_bytes > budget:
                t.status, t.reason = "over_budget", f"peak {t.peak_bytes / MiB:.0f} MiB > budget"
            if times:
                t.step_s = statistics.median(times)
                t.samples_per_s = bs / t.step_s
        return t

    lo, hi = 0, None
    try:
        bs = max(1, start)
        for _ in range(
            4
        ):  # a re-checked edge that fits restarts the doubling above it (rarely more than once)
            failed = False
            hi = None
            while bs <= max_batch_size:
                t = trial(bs)
                result.trials.append(t)
                if t.status == "failed":
                    failed = True
                    break
                if not t.fits:
                    hi = bs
                    break
                lo = bs
                bs *= 2
            if failed or hi is None or lo == 0:
                break
            while hi - lo > max(1, int(lo * tolerance)):
                mid = (lo + hi) // 2
                t = trial(mid)
                result.trials.append(t)
                if t.status == "failed":
                    failed = True
                    break
                if t.fits:
                    lo = mid
                else:
                    hi = mid
            # The edge may be a size that was only predicted not to fit, from an extrapolation made before
            # the sizes near it were measured: re-predict with them, and measure it if it may fit now.
            edge = next((t for t in reversed(result.trials) if t.batch_size == hi), None)
            if failed or edge is None or edge.status != "predicted_over":
                break
            pred = _predict(result.trials, hi)
            if pred is None or pred > budget:
                break
            t = trial(hi)
            result.trials.append(t)
            if not t.fits:
                break
            lo, bs = hi, hi * 2
    except KeyboardInterrupt:
        result.interrupted = True
    finally:
        saved.restore()
        meter.cleanup()
    result.best = lo or None
    return result


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
    fit_sizes = {t.batch_size for t in fits}
    first_bad = min(
        (t for t in result.trials if not t.fits and t.status != "failed" and t.batch_size not in fit_sizes),
        key=lambda t: t.batch_size,
        default=None,
    )
    top = max(fits, key=lambda t: t.samples_per_s or 0.0)
    bad_txt = (
        f"; batch size {first_bad.batch_size}: {first_bad.status.replace('_', ' ')}"
        + (f" ({first_bad.reason})" if first_bad.reason else "")
        if first_bad
        else " (the search reached its maximum)"
    )
    out.append(
        Finding(
            id="tune.batch_size.best",
            severity=Severity.INFO,
            title=f"Largest batch size that fits: {result.best}",
            evidence=f"batch size {result.best}: peak {best.peak_bytes / MiB:.0f} MiB ({result.memory_measure}) of a "
            f"{result.budget_bytes / MiB:.0f} MiB budget on {result.device}, "
            f"{best.samples_per_s or 0:.1f} samples/s{bad_txt}",
            data={
                "best": result.best,
                "budget_bytes": result.budget_bytes,
                "peak_bytes": best.peak_bytes,
                "samples_per_s": best.samples_per_s,
            },
            fix="Batch sizes up to this fit; scale the learning rate with the batch size if you change it.",
        )
    )
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
