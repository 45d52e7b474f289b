"""``compress_report``: baseline vs each compression method, every number measured in this run.

Per method: parameter count, size of the saved state_dict (and gzipped), forward latency at batch 1 and
batch N (torch.utils.benchmark median), top-1 accuracy on the eval data, and the fraction of weights
that are exactly zero. A method that does not apply is a row with the reason; a method that fails is a
row with the error. Interrupting keeps the rows measured so far.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

from pitstop.compress.distillation import distill
from pitstop.compress.measure import (
    accuracy,
    interleaved_latency,
    param_count,
    rows_of,
    serialized_size,
    sparsity,
    split_batch,
    take_rows,
)
from pitstop.compress.pruning import prune_detailed
from pitstop.compress.quantization import NotApplicable, quantize_detailed
from pitstop.compress.report_findings import findings_from_rows
from pitstop.compress.table import (
    ALL_METHODS,
    DISTILL_METHODS,
    PRUNE_METHODS,
    QUANT_METHODS,
    ReportOptions,
    Row,
)
from pitstop.findings import Report
from pitstop.host.machine import machine_line

Progress = Callable[[str, int, int], None]


@dataclass
class _Built:
    """A method's result before latency: the model that runs and the module that is saved."""

    row: Row
    run: nn.Module | None = None


def _static_measures(
    row: Row, run_model: nn.Module, save_model: nn.Module, eval_loader: Iterable[Any], opts: ReportOptions
) -> None:
    size = serialized_size(save_model)
    row.size_bytes, row.gzip_bytes = size.bytes, size.gzip_bytes
    row.params = param_count(save_model)
    if "int8" not in row.method:  # quantized weights are packed buffers: their zeros are not pruning
        sp = sparsity(run_model)
        if sp.weight_total:
            row.weight_sparsity = sp.weights
            row.nonzero_params = sp.param_total - sp.param_zeros
    acc = accuracy(run_model, eval_loader, opts.eval_batches)
    row.accuracy, row.eval_samples = acc.value, acc.samples
    if acc.value is None:
        row.notes = (row.notes + "; " if row.notes else "") + f"accuracy not measured: {acc.reason}"


def compress_report(
    model: nn.Module,
    eval_loader: Iterable[Any],
    options: ReportOptions | None = None,
    train_loader: Iterable[Any] | None = None,
    calib_loader: Iterable[Any] | None = None,
    student: nn.Module | Callable[[], nn.Module] | None = None,
    progress: Progress | None = None,
    meta: dict[str, Any] | None = None,
) -> Report:
    """Measure ``model`` (the baseline) and each method in ``options.methods`` on ``eval_loader``.

    Two phases: each method is applied and measured for size, sparsity and accuracy; then the latency of
    all of them is measured round-robin (``latency_rounds``), so background load hits them alike.
    train_loader: fine-tune after pruning, and train the student (``student``/``distill`` rows).
    calib_loader: static int8 calibration (default: train_loader, else eval_loader).
    student: an untrained student module, or a factory returning one (the ``student`` and ``distill``
    rows each start from a fresh copy made after seeding with ``options.seed``).
    """
    opts = options or ReportOptions()
    unknown = [m for m in opts.methods if m not in ALL_METHODS]
    if unknown:
        raise ValueError(f"unknown method(s) {', '.join(unknown)}; choose from {', '.join(ALL_METHODS)}")
    model = model.cpu().eval()
    x = _latency_batch(eval_loader, opts)
    threads = opts.threads or torch.get_num_threads()
    calib = (
        calib_loader
        if calib_loader is not None
        else (train_loader if train_loader is not None else eval_loader)
    )
    report = Report(tool="compress", meta=dict(meta or {}))
    report.meta.update(
        {
            "machine": machine_line(),
            "threads": threads,
            "batch_n": rows_of(x),
            "device": "cpu",
            "calibration": "calib data"
            if calib_loader is not None
            else ("train data" if train_loader is not None else "eval data"),
            "options": {k: v for k, v in asdict(opts).items() if k != "methods"},
            "methods": list(opts.methods),
        }
    )
    plan = ["baseline", *opts.methods]
    total = len(plan) + max(opts.latency_rounds, 1)
    built: list[_Built] = []
    try:
        for i, method in enumerate(plan):
            if progress:
                progress(method, i, total)
            built.append(_build(method, model, eval_loader, train_loader, calib, student, opts))
        _measure_latency(built, x, opts, threads, progress, len(plan), total)
        if progress:
            progress("done", total, total)
    except KeyboardInterrupt:
        report.error = f"interrupted after {len(built)} of {len(plan)} methods; what was measured is kept"
        report.meta["interrupted"] = True
    rows = [b.row for b in built]
    report.sections["compress"] = {"rows": [r.to_dict() for r in rows]}
    report.add(*findings_from_rows(rows, opts))
    return report


def _latency_batch(eval_loader: Iterable[Any], opts: ReportOptions) -> Any:
    """The inputs of the eval data's first batch (its first ``opts.batch_n`` rows), timed as batch n."""
    first = next(iter(eval_loader), None)
    if first is None:
        raise ValueError("the eval data is empty")
    x, _ = split_batch(first)
    if opts.batch_n is not None:
        x = take_rows(x, opts.batch_n)
    return x


def _measure_latency(
    built: list[_Built],
    x: Any,
    opts: ReportOptions,
    threads: int,
    progress: Progress | None,
    done: int,
    total: int,
) -> None:
    """Time every built model that runs, round-robin at batch 1 and batch n, into its row (median, runs,
    IQR, min and interval); ``done`` is the progress count before the rounds."""
    live = {b.row.method: b.run for b in built if b.run is not None}
    if not live:
        return

    def on_round(r: int) -> None:
        if progress:
            progress(f"latency round {r}", done + r, total)

    if progress:
        progress("latency", done, total)
    b1 = interleaved_latency(live, take_rows(x, 1), opts.latency_rounds, threads, opts.min_run_time)
    bn = interleaved_latency(live, x, opts.latency_rounds, threads, opts.min_run_time, on_round)
    for b in built:
        if b.row.method in live:
            name = b.row.method
            b.row.latency_b1_s, b.row.latency_bn_s = b1[name].median_s, bn[name].median_s
            b.row.batch_n = bn[name].batch
            b.row.extra["latency_runs"] = {"batch_1": b1[name].runs, "batch_n": bn[name].runs}
            b.row.extra["latency_iqr_s"] = {"batch_1": b1[name].iqr_s, "batch_n": bn[name].iqr_s}
            b.row.extra["latency_min_s"] = {"batch_1": b1[name].min_s, "batch_n": bn[name].min_s}
            b.row.extra["latency_interval"] = {
                k: lat[name].interval.to_dict()
                for k, lat in (("batch_1", b1), ("batch_n", bn))
                if lat[name].interval is not None
            }


def _build(
    method: str,
    model: nn.Module,
    eval_loader: Iterable[Any],
    train_loader: Iterable[Any] | None,
    calib: Iterable[Any],
    student: nn.Module | Callable[[], nn.Module] | None,
    opts: ReportOptions,
) -> _Built:
    """Apply one method and measure everything but latency; a failure becomes the row's error."""
    row = Row(method)
    t0 = time.perf_counter()
    try:
        if method == "baseline":
            row.library = "torch (fp32)"
            run, saved = model, model
        elif method in QUANT_METHODS:
            run, saved = _quantized(row, model, calib, opts)
        elif method in PRUNE_METHODS:
            run = saved = _pruned(row, model, train_loader, opts)
        elif method in DISTILL_METHODS:
            run = saved = _student(row, model, train_loader, student, opts)
        else:
            raise ValueError(f"unknown method {method!r}")
        if method != "baseline":
            row.apply_s = time.perf_counter() - t0
        _static_measures(row, run, saved, eval_loader, opts)
        return _Built(row, run)
    except NotApplicable as e:
        row.applicable, row.reason = False, str(e)
    except KeyboardInterrupt:
        raise
    except Exception as e:  # one method failing must not lose the others' measurements
        first_line = str(e).strip().splitlines()[0][:300] if str(e).strip() else ""
        row.error = f"{type(e).__name__}: {first_line}"
    return _Built(row)


def _quantized(
    row: Row, model: nn.Module, calib: Iterable[Any], opts: ReportOptions
) -> tuple[nn.Module, nn.Module]:
    q = quantize_detailed(model, row.method, calib, opts.calib_batches)
    row.library, row.notes = q.library, q.notes
    row.extra["quantized_layers"] = q.quantized_layers
    return q.model, q.portable


def _pruned(row: Row, model: nn.Module, train_loader: Iterable[Any] | None, opts: ReportOptions) -> nn.Module:
    structured = row.method == "prune_structured"
    amount = opts.structured_amount if structured else opts.prune_amount
    p = prune_detailed(
        model,
        amount,
        structured,
        finetune_loader=train_loader,
        finetune_steps=opts.finetune_steps if train_loader is not None else 0,
        lr=opts.lr,
        seed=opts.seed,
        remove_channels=structured and opts.remove_channels,
    )
    row.library = "torch.nn.utils.prune"
    what = f"{amount:.0%} of output channels (L2) per layer" if structured else f"{amount:.0%} global L1"
    tune = (
        f"fine-tuned {p.finetune.steps} steps ({p.finetune.loop})"
        if p.finetune
        else "no fine-tune (no train data)"
    )
    if p.shrunk is not None:
        stored = (
            f"{p.shrunk.channels_removed} of {p.shrunk.channels_total} channels removed from "
            f"{p.shrunk.layers_changed} layer pairs, the rest stored dense"
        )
    else:
        stored = "zeros stored dense"
    row.notes = f"{what}; {tune}; {stored}"
    row.extra.update(
        {
            "amount": amount,
            "structured": structured,
            "finetune_steps": p.finetune.steps if p.finetune else 0,
            "channels_removed": p.shrunk.channels_removed if p.shrunk else 0,
        }
    )
    return p.model


def _student(
    row: Row,
    teacher: nn.Module,
    train_loader: Iterable[Any] | None,
    student: nn.Module | Callable[[], nn.Module] | None,
    opts: ReportOptions,
) -> nn.Module:
    """``student``: trained on labels alone; ``distill``: the same start, steps and batches, with the teacher."""
    if student is None:
        raise NotApplicable("needs a student model (--student)")
    if train_loader is None:
        raise NotApplicable("needs training data (--train-data)")
    torch.manual_seed(opts.seed)
    s = student() if callable(student) and not isinstance(student, nn.Module) else copy.deepcopy(student)
    alpha = opts.alpha if row.method == "distill" else 0.0
    res = distill(
        teacher,
        s,
        train_loader,
        T=opts.temperature,
        alpha=alpha,
        steps=opts.distill_steps,
        lr=opts.lr,
        seed=opts.seed,
    )
    s.eval()
    row.library = (
        f"KL(T={opts.temperature:g}) x{alpha:g} + CE ({res.loop})" if alpha else f"CE only ({res.loop})"
    )
    row.notes = f"student trained {res.steps} steps" + (" with the teacher" if alpha else " on labels alone")
    row.extra.update({"steps": res.steps, "alpha": alpha, "T": opts.temperature})
    return s
