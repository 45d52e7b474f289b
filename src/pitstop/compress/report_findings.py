"""Compression report rows -> Findings: each method against the baseline (size, latency, accuracy within the
allowed drop), students vs the teacher, and a note when the latency timings carry interference."""

from __future__ import annotations

from collections.abc import Sequence

from pitstop.compress.table import DISTILL_METHODS, ReportOptions, Row
from pitstop.findings import Finding, Severity
from pitstop.measure import HELPED, HURT, UNDECIDED, Interval, decide


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


def _engine_verdicts(r: Row) -> list[str]:
    """``pitstop.measure.decide`` on each batch size's interval over the baseline (``SPEED_MARGIN`` as
    the gain that counts, every round in): helped, hurt, no change or undecided; [] without intervals."""
    out = []
    for d in (r.extra.get("latency_interval") or {}).values():
        iv = Interval(**d)
        out.append(decide(iv, SPEED_MARGIN, min_rounds=2) or UNDECIDED)
    return out


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
    ivs = r.extra.get("latency_interval") or {}
    parts += [f"speed-up at {k.replace('_', ' ')}: {Interval(**d).text()}" for k, d in ivs.items()]
    ev = "; ".join(p for p in parts if p) + (f" ({r.notes})" if r.notes else "")
    smaller = (size_x or 0) > 1.05  # sizes are exact; timings are not:
    speeds = [v for v in (b1_x, bn_x) if v]
    # a speed change counts only when it exceeds SPEED_MARGIN by the medians and by the fastest runs
    # alike, so that a load spike during one model's timing is not reported as a gain or a loss
    both = [_speedups(base, r, b) for b in ("batch_1", "batch_n")]
    faster = any(lo > 1 + SPEED_MARGIN for lo, _ in both if lo)
    slower = any(hi < 1 - SPEED_MARGIN for _, hi in both if hi)
    verdicts = _engine_verdicts(r)
    if verdicts:  # the rounds' interval decides, where the timing engine measured one
        faster, slower = HELPED in verdicts, HURT in verdicts
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
