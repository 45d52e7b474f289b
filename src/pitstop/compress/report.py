"""``compress_report``: baseline vs each compression method, every number measured in this run.

Per method: parameter count, size of the saved state_dict (and gzipped), forward latency at batch 1 and
batch N (torch.utils.benchmark median), top-1 accuracy on the eval data, and the fraction of weights
that are exactly zero. A method that does not apply is a row with the reason; a method that fails is a
row with the error. Interrupting keeps the rows measured so far.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
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
from pitstop.findings import Finding, Report, Severity
from pitstop.host.machine import machine_line

QUANT_METHODS = ("dynamic_int8", "static_int8", "int8_weight_only")
PRUNE_METHODS = ("prune_global", "prune_structured")
DISTILL_METHODS = ("student", "distill")
ALL_METHODS = (*QUANT_METHODS, *PRUNE_METHODS, *DISTILL_METHODS)
# int8_weight_only (torchao) runs in eager as a tensor subclass: slow on CPU without torch.compile, so it
# is opt-in; student/distill need a student model and training data.
DEFAULT_METHODS = ("dynamic_int8", "static_int8", "prune_global", "prune_structured")

Progress = Callable[[str, int, int], None]


@dataclass
class ReportOptions:
    methods: Sequence[str] = DEFAULT_METHODS
    prune_amount: float = 0.5
    structured_amount: float = 0.3
    remove_channels: bool = True  # structured: delete zeroed channels where exact (pitstop.compress.shrink)
    finetune_steps: int = 100
    lr: float = 1e-3
    distill_steps: int = 200
    temperature: float = 4.0
    alpha: float = 0.9
    calib_batches: int = 8
    eval_batches: int | None = None
    batch_n: int | None = None  # rows of the first eval batch when None
    threads: int | None = None
    min_run_time: float = 0.5  # seconds of timing per model and batch size, over all rounds
    latency_rounds: int = 3
    max_acc_drop: float = 0.01  # accuracy loss (fraction) still counted as "kept"
    seed: int = 0


@dataclass
class Row:
    """One line of the comparison table. ``applicable`` False: ``reason`` says why; ``error``: it failed."""

    method: str
    applicable: bool = True
    reason: str = ""
    error: str = ""
    library: str = ""
    params: int | None = None
    nonzero_params: int | None = None
    size_bytes: int | None = None
    gzip_bytes: int | None = None
    latency_b1_s: float | None = None
    latency_bn_s: float | None = None
    batch_n: int | None = None
    accuracy: float | None = None
    eval_samples: int = 0
    weight_sparsity: float | None = None
    apply_s: float | None = None
    notes: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


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
    first = next(iter(eval_loader), None)
    if first is None:
        raise ValueError("the eval data is empty")
    x, _ = split_batch(first)
    if opts.batch_n is not None:
        x = take_rows(x, opts.batch_n)
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
        live = {b.row.method: b.run for b in built if b.run is not None}
        if live:

            def on_round(r: int) -> None:
                if progress:
                    progress(f"latency round {r}", len(plan) + r, total)

            if progress:
                progress("latency", len(plan), total)
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
        if progress:
            progress("done", total, total)
    except KeyboardInterrupt:
        report.error = f"interrupted after {len(built)} of {len(plan)} methods; what was measured is kept"
        report.meta["interrupted"] = True
    rows = [b.row for b in built]
    report.sections["compress"] = {"rows": [r.to_dict() for r in rows]}
    report.add(*findings_from_rows(rows, opts))
    return report


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


def _kb(n: int | None) -> str:
    return "?" if n is None else (f"{n / 1e6:.2f} MB" if n >= 1e6 else f"{n / 1e3:.1f} KB")


def fmt_time(s: float | None) -> str:
    if s is None:
        return "?"
    if s < 1e-3:
        return f"{s * 1e6:.0f} µs"
    return f"{s * 1e3:.2f} ms" if s < 1 else f"{s:.2f} s"


def _pct(v: float | None) -> str:
    return "n/a" if v is None else f"{100 * v:.1f}%"


def _ratio(base: float | None, new: float | None) -> float | None:
    return base / new if base and new else None


FIX_CODE = {
    "dynamic_int8": 'from pitstop.compress import quantize\nqmodel = quantize(model, method="dynamic_int8")',
    "static_int8": 'from pitstop.compress import quantize\nqmodel = quantize(model, method="static_int8", calib_loader=loader)',
    "int8_weight_only": 'from pitstop.compress import quantize\nqmodel = quantize(model, method="int8_weight_only")',
    "prune_global": "from pitstop.compress import prune\npmodel = prune(model, amount={amount}, finetune_loader=train_loader, finetune_steps={steps})",
    "prune_structured": "from pitstop.compress import prune\npmodel = prune(model, amount={amount}, structured=True, remove_channels=True, finetune_loader=train_loader, finetune_steps={steps})",
    "distill": "from pitstop.compress import distill\ndistill(teacher, student, train_loader, T={T}, alpha={alpha}, steps={steps})",
}


def findings_from_rows(rows: Sequence[Row], opts: ReportOptions) -> list[Finding]:
    base = next((r for r in rows if r.method == "baseline" and not r.error), None)
    out: list[Finding] = []
    for r in rows:
        fid = f"compress.{r.method}"
        if r.error:
            out.append(
                Finding(
                    fid,
                    Severity.WARN,
                    f"{r.method}: failed",
                    r.error,
                    data=r.to_dict(),
                    fix="see the error; the other methods were measured",
                )
            )
            continue
        if not r.applicable:
            out.append(Finding(fid, Severity.INFO, f"{r.method}: not applicable", r.reason, data=r.to_dict()))
            continue
        if r.method == "baseline" or base is None:
            ev = (
                f"{r.params:,} params, saved {_kb(r.size_bytes)}, median latency {fmt_time(r.latency_b1_s)} at "
                f"batch 1 and {fmt_time(r.latency_bn_s)} at batch {r.batch_n}, accuracy {_pct(r.accuracy)} on "
                f"{r.eval_samples} samples"
            )
            out.append(Finding(fid, Severity.INFO, f"{r.method}: measured", ev, data=r.to_dict()))
            continue
        if r.method in DISTILL_METHODS:
            alone = next((o for o in rows if o.method == "student" and o.applicable and not o.error), None)
            out.append(_student_finding(fid, r, base, alone))
            continue
        out.append(_compare(fid, r, base, opts))
    noisy = _latency_noise(rows)
    if noisy is not None:
        out.append(noisy)
    return out


NOISE_RATIO = 2.0  # median over min beyond this: the timings carry interference, not the model


def _latency_noise(rows: Sequence[Row]) -> Finding | None:
    """Flag timings whose median is far above their min: another process took the cores mid-measurement,
    so latency ratios between rows are not trustworthy (sizes and accuracies are unaffected)."""
    worst: tuple[float, str, str, float, float] | None = None
    for r in rows:
        mins = r.extra.get("latency_min_s", {})
        for batch, med in (("batch_1", r.latency_b1_s), ("batch_n", r.latency_bn_s)):
            lo = mins.get(batch)
            if med and lo and (worst is None or med / lo > worst[0]):
                worst = (med / lo, r.method, batch, med, lo)
    if worst is None or worst[0] <= NOISE_RATIO:
        return None
    ratio, method, batch, med, lo = worst
    where = "batch 1" if batch == "batch_1" else f"batch {rows[0].batch_n}"
    return Finding(
        "compress.latency_noise",
        Severity.WARN,
        "latency timings were disturbed: compare speeds with care",
        f"{method} at {where}: median {fmt_time(med)} vs fastest run {fmt_time(lo)} ({ratio:.1f}x); "
        "other work competed for the CPU while timing (sizes and accuracies are unaffected)",
        data={"method": method, "batch": batch, "median_s": med, "min_s": lo, "ratio": ratio},
        fix="re-run on a quiet machine, or with fewer threads (--threads 1) and more --rounds",
        fix_code="pitstop compress report ... --threads 1 --rounds 8",
    )


def _student_finding(fid: str, r: Row, teacher: Row, alone: Row | None) -> Finding:
    """student: the reference a distilled student must beat. distill: did the teacher help, measured."""
    size_x = _ratio(teacher.size_bytes, r.size_bytes)
    bn_x = _ratio(teacher.latency_bn_s, r.latency_bn_s)
    parts = [
        f"{r.params:,} params vs teacher {teacher.params:,}" if r.params and teacher.params else "",
        f"{size_x:.1f}x smaller on disk" if size_x else "",
        f"{bn_x:.2f}x the teacher's speed at batch {r.batch_n}" if bn_x else "",
        f"accuracy: teacher {_pct(teacher.accuracy)}, this {_pct(r.accuracy)}",
    ]
    if r.method == "distill" and alone is not None:
        parts[-1] += f", same student without the teacher {_pct(alone.accuracy)}"
    ev = "; ".join(p for p in parts if p) + f" on {r.eval_samples} samples ({r.notes})"
    if r.method == "student":
        return Finding(
            fid,
            Severity.INFO,
            "student: trained on labels alone (the distill baseline)",
            ev,
            data=r.to_dict(),
        )
    if alone is None or r.accuracy is None or alone.accuracy is None:
        title = "distill: measured, but not against the same student trained alone (add method 'student')"
        return Finding(fid, Severity.INFO, title, ev, data=r.to_dict())
    gain = r.accuracy - alone.accuracy
    if gain > 0:
        code = FIX_CODE["distill"].format(
            T=r.extra.get("T"), alpha=r.extra.get("alpha"), steps=r.extra.get("steps")
        )
        return Finding(
            fid,
            Severity.PASS,
            f"distill: +{100 * gain:.1f} points over the student trained alone",
            ev,
            data=r.to_dict(),
            fix="train the small model with the teacher's soft targets",
            fix_code=code,
        )
    return Finding(
        fid,
        Severity.WARN,
        f"distill: no gain over the student trained alone ({100 * gain:+.1f} points)",
        ev,
        data=r.to_dict(),
        fix="try a higher temperature, more steps, or a lower alpha; distillation helps most with few labels",
    )


SPEED_MARGIN = 0.10


def _speedups(base: Row, r: Row, batch: str) -> tuple[float | None, float | None]:
    """(smaller, larger) of the speed-up by medians and by fastest runs; the median alone when the
    fastest runs are not known."""
    med_b, med_r = (
        (base.latency_b1_s, r.latency_b1_s) if batch == "batch_1" else (base.latency_bn_s, r.latency_bn_s)
    )
    by_median = _ratio(med_b, med_r)
    by_min = _ratio(
        base.extra.get("latency_min_s", {}).get(batch), r.extra.get("latency_min_s", {}).get(batch)
    )
    vals = [v for v in (by_median, by_min) if v]
    return (min(vals), max(vals)) if vals else (None, None)


def _compare(fid: str, r: Row, base: Row, opts: ReportOptions) -> Finding:
    size_x = _ratio(base.size_bytes, r.size_bytes)
    b1_x = _ratio(base.latency_b1_s, r.latency_b1_s)
    bn_x = _ratio(base.latency_bn_s, r.latency_bn_s)
    drop = None if r.accuracy is None or base.accuracy is None else base.accuracy - r.accuracy
    parts = [
        f"saved {_kb(base.size_bytes)} -> {_kb(r.size_bytes)} ({size_x:.2f}x smaller)" if size_x else "",
        f"batch 1 {fmt_time(base.latency_b1_s)} -> {fmt_time(r.latency_b1_s)} ({b1_x:.2f}x)" if b1_x else "",
        f"batch {r.batch_n} {fmt_time(base.latency_bn_s)} -> {fmt_time(r.latency_bn_s)} ({bn_x:.2f}x)"
        if bn_x
        else "",
        f"accuracy {_pct(base.accuracy)} -> {_pct(r.accuracy)} on {r.eval_samples} samples"
        if drop is not None
        else "accuracy not measured",
        f"{_pct(r.weight_sparsity)} of weights zero"
        if r.weight_sparsity is not None and r.method.startswith("prune")
        else "",
    ]
    ev = "; ".join(p for p in parts if p) + (f" ({r.notes})" if r.notes else "")
    smaller = (size_x or 0) > 1.05  # sizes are exact; timings are not:
    speeds = [v for v in (b1_x, bn_x) if v]
    # a speed change counts only when it exceeds SPEED_MARGIN by the medians and by the fastest runs
    # alike, so that a load spike during one model's timing is not reported as a gain or a loss
    both = [_speedups(base, r, b) for b in ("batch_1", "batch_n")]
    faster = any(lo > 1 + SPEED_MARGIN for lo, _ in both if lo)
    slower = any(hi < 1 - SPEED_MARGIN for _, hi in both if hi)
    if drop is not None and drop > opts.max_acc_drop:
        sev, title = Severity.WARN, f"{r.method}: accuracy drops {100 * drop:.1f} points"
    elif not (smaller or faster):
        sev, title = Severity.INFO, f"{r.method}: no size or speed gain measured"
    else:
        # PASS only when nothing got worse; a smaller-but-slower result is a trade-off to weigh (INFO).
        sev = Severity.INFO if slower else Severity.PASS
        bits = [f"{size_x:.1f}x smaller" if smaller else ""]
        if speeds:
            lo, hi = min(speeds), max(speeds)
            bits.append(
                f"{lo:.2f}x speed" if abs(hi - lo) < 0.05 else f"{lo:.2f}-{hi:.2f}x speed (batch 1/N)"
            )
        if drop is not None:
            bits.append("accuracy kept")
        title = f"{r.method}: " + ", ".join(b for b in bits if b)
    code = FIX_CODE.get(r.method)
    if code:
        steps = r.extra.get("finetune_steps", r.extra.get("steps"))
        code = code.format(amount=r.extra.get("amount"), steps=steps, T=opts.temperature, alpha=opts.alpha)
    if sev is Severity.WARN:
        fix = "fine-tune longer, prune less, or calibrate on more representative data"
    elif sev is Severity.PASS:
        fix = "use the compressed model: it measured smaller or faster with accuracy kept"
    elif smaller or faster:
        fix = "a trade-off: use it where size (or the faster batch size) matters more than the slower one"
    else:
        fix = ""
    return Finding(
        fid,
        sev,
        title,
        ev,
        data=r.to_dict(),
        fix=fix,
        fix_code=code if fix and sev is not Severity.WARN else None,
    )
