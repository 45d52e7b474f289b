"""What a compressed model is judged by, measured: parameters, bytes on disk, latency, accuracy, zeros.

Pure measurement functions; nothing here changes the model (latency and accuracy run under no_grad in
eval mode and restore the training flag).
"""

from __future__ import annotations

import contextlib
import gzip
import math
import os
import statistics
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn

from pitstop.measure import Arm, Interval, Settings, interleave


@contextlib.contextmanager
def eval_mode(model: nn.Module) -> Iterator[None]:
    """Eval mode for the duration, then the previous mode. Exported graph modules refuse ``eval()``
    unless prepared for it; they are already in inference form, so they are left as they are."""
    was_training = model.training
    try:
        model.eval()
    except NotImplementedError:
        yield
        return
    try:
        yield
    finally:
        model.train(was_training)


def split_batch(batch: Any) -> tuple[Any, Any]:
    """``(inputs, target)`` from a loader batch: ``(x, y)`` pairs, or a bare input with no target."""
    if isinstance(batch, (list, tuple)) and len(batch) == 2:
        return batch[0], batch[1]
    return batch, None


def call_model(model: nn.Module, x: Any) -> Any:
    """``model(x)``, or ``model(*x)`` when the input is a tuple of tensors."""
    if isinstance(x, tuple):
        return model(*x)
    return model(x)


def as_args(x: Any) -> tuple[Any, ...]:
    return x if isinstance(x, tuple) else (x,)


def take_rows(x: Any, n: int) -> Any:
    """The first ``n`` rows of every tensor in ``x`` (a tensor or a tuple of tensors)."""
    if isinstance(x, tuple):
        return tuple(t[:n] for t in x)
    return x[:n]


def rows_of(x: Any) -> int:
    return int(as_args(x)[0].shape[0])


_INT_WEIGHTS = (torch.int8, torch.uint8, torch.qint8, torch.quint8)


def param_count(model: nn.Module) -> int:
    """Parameter elements, however stored: ``nn.Parameter``s plus int8 weight buffers (PT2E's frozen int8
    weights) and torch.ao's packed (weight, bias) pairs. Buffers such as BatchNorm running statistics and
    quantization scales do not count. Equals ``sum(p.numel() for p in model.parameters())`` for a float
    model; a quantized model keeps its count (its elements are smaller, not fewer)."""
    total = sum(p.numel() for p in model.parameters())
    params = {name for name, _ in model.named_parameters()}
    for name, v in model.state_dict().items():
        if name in params:
            continue
        if isinstance(v, tuple):  # torch.ao dynamic Linear packs (weight, bias)
            total += sum(t.numel() for t in v if isinstance(t, torch.Tensor))
        elif isinstance(v, torch.Tensor) and v.dtype in _INT_WEIGHTS and v.dim() > 1:
            total += v.numel()
    return total


@dataclass(frozen=True)
class DiskSize:
    """``torch.save(state_dict)`` on disk, and the same bytes gzip-compressed (where pruned zeros pay)."""

    bytes: int
    gzip_bytes: int


def serialized_size(model: nn.Module, gzip_level: int = 6) -> DiskSize:
    """Save the state_dict to a temporary ``model.pt``, as a user would, and read its size back.

    The file name is fixed because torch.save stores entries under it: sizes then compare exactly."""
    with tempfile.TemporaryDirectory(prefix="pitstop-compress-") as tmp:
        path = os.path.join(tmp, "model.pt")
        torch.save(model.state_dict(), path)
        size = os.path.getsize(path)
        with open(path, "rb") as fh:
            gz = len(gzip.compress(fh.read(), compresslevel=gzip_level))
    return DiskSize(size, gz)


@dataclass(frozen=True)
class Latency:
    """Median forward time from ``torch.utils.benchmark`` (blocked autorange), per batch."""

    batch: int
    median_s: float
    iqr_s: float
    runs: int
    threads: int
    min_s: float = 0.0
    # speed-up over the first model timed with it (``interleaved_latency``), from ``pitstop.measure``
    interval: Interval | None = None


def _timer(model: nn.Module, x: Any, threads: int) -> Any:
    from pitstop.torchbench import torch_benchmark

    benchmark = torch_benchmark()

    def run() -> None:
        with torch.no_grad():
            call_model(model, x)

    with eval_mode(model):
        run()  # the first call builds kernels / oneDNN primitives: not part of the steady state
    return benchmark.Timer(stmt="run()", globals={"run": run}, num_threads=threads)


def _summarize(times: list[float], batch: int, threads: int) -> Latency:
    q = statistics.quantiles(times, n=4) if len(times) > 1 else [times[0]] * 3
    return Latency(batch, statistics.median(times), q[2] - q[0], len(times), threads, min(times))


def latency(model: nn.Module, x: Any, threads: int | None = None, min_run_time: float = 0.5) -> Latency:
    """Forward latency of ``model`` on input ``x`` under no_grad; warm-up and timing by torch.utils.benchmark."""
    threads = threads or torch.get_num_threads()
    with eval_mode(model):
        m = _timer(model, x, threads).blocked_autorange(min_run_time=min_run_time)
    return _summarize(list(m.times), rows_of(x), threads)


def interleaved_latency(
    models: dict[str, nn.Module],
    x: Any,
    rounds: int = 3,
    threads: int | None = None,
    min_run_time: float = 0.5,
    on_round: Callable[[int], None] | None = None,
) -> dict[str, Latency]:
    """Latency of several models on the same input in the timing engine's rotating rounds
    (``pitstop.measure.interleave``), so that background load on a shared machine hits them alike: each
    round times every model with ``blocked_autorange`` for ``min_run_time / rounds`` seconds (its block
    times are that round's samples). Median and IQR pool every kept block time; ``interval`` is the
    engine's speed-up of each model over the first (the baseline) from the per-round medians."""
    threads = threads or torch.get_num_threads()
    timers = {name: _timer(m, x, threads) for name, m in models.items()}
    per_round = max(min_run_time / max(rounds, 1), 0.01)
    names = list(models)
    base, arms = Arm(names[0]), [Arm(n) for n in names[1:]]
    done = [0]

    def sample(name: str) -> list[float]:
        with eval_mode(models[name]):
            times = list(timers[name].blocked_autorange(min_run_time=per_round).times)
        done[0] += 1
        if on_round is not None and done[0] % len(names) == 0:
            on_round(done[0] // len(names))
        return times

    interleave(base, arms, sample, Settings.every_round(max(rounds, 1)))  # no arms: the baseline's rounds
    out = {}
    for arm in [base, *arms]:
        kept = [v for r in arm.rounds for v in r] or [math.nan]
        lat = _summarize(kept, rows_of(x), threads)
        out[arm.name] = replace(lat, interval=arm.interval if arm is not base else None)
    return out


@dataclass(frozen=True)
class Accuracy:
    """Top-1 accuracy over ``samples`` eval samples; None when outputs are not class logits."""

    value: float | None
    samples: int
    reason: str = ""


def accuracy(model: nn.Module, loader: Iterable[Any], max_batches: int | None = None) -> Accuracy:
    """Top-1 accuracy for ``(x, y)`` batches whose output is ``[batch, classes]`` logits."""
    correct = total = 0
    with eval_mode(model), torch.no_grad():
        for i, batch in enumerate(loader):
            if max_batches is not None and i >= max_batches:
                break
            x, y = split_batch(batch)
            if not isinstance(y, torch.Tensor):
                return Accuracy(None, 0, "batches carry no target tensor")
            out = call_model(model, x)
            if not (isinstance(out, torch.Tensor) and out.dim() == 2 and y.dim() == 1):
                return Accuracy(None, 0, "output is not [batch, classes] logits with [batch] targets")
            if y.is_floating_point():
                return Accuracy(None, 0, "targets are not class indices")
            correct += int((out.argmax(1) == y.to(out.device)).sum())
            total += int(y.shape[0])
    if not total:
        return Accuracy(None, 0, "the eval data is empty")
    return Accuracy(correct / total, total)


PRUNABLE = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)


@dataclass(frozen=True)
class Sparsity:
    """Zeros counted in the weights of prunable layers, and in every parameter."""

    weight_zeros: int
    weight_total: int
    param_zeros: int
    param_total: int

    @property
    def weights(self) -> float:
        return self.weight_zeros / self.weight_total if self.weight_total else 0.0

    @property
    def params(self) -> float:
        return self.param_zeros / self.param_total if self.param_total else 0.0


def sparsity(model: nn.Module) -> Sparsity:
    """Count exact zeros in the effective weights (``module.weight``, which includes a pruning mask that
    is not yet permanent) of prunable layers, and in all parameters."""
    wz = wt = 0
    for mod in model.modules():
        if isinstance(mod, PRUNABLE) and isinstance(getattr(mod, "weight", None), torch.Tensor):
            w = mod.weight.detach()
            wz += int((w == 0).sum())
            wt += w.numel()
    pz = pt = 0
    for mod in model.modules():
        for name, p in mod.named_parameters(recurse=False):
            # An active pruning hook keeps the dense tensor as ``<name>_orig``; count the masked one.
            t = getattr(mod, name[: -len("_orig")]) if name.endswith("_orig") else p
            pz += int((t.detach() == 0).sum())
            pt += t.numel()
    return Sparsity(wz, wt, pz, pt)
