"""Measured tune results -> Report (findings + sections) and HTML blocks. Builds data; never measures."""

from __future__ import annotations

import math
from typing import Any

from pitstop.findings import Report
from pitstop.report.html import Block, line_chart, table
from pitstop.tune.batch_size import BatchSizeResult, batch_size_findings
from pitstop.tune.loader import LoaderTuneResult
from pitstop.tune.loader_measure import DEFAULT_PREFETCH
from pitstop.tune.lr import LRResult, lr_findings
from pitstop.units import MiB


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


def loader_report(result: LoaderTuneResult, meta: dict[str, Any] | None = None) -> tuple[Report, list[Block]]:
    report = Report(
        tool="tune loader",
        findings=list(result.findings),
        sections={"loader_tune": result.to_dict()},
        meta={**result.meta, **(meta or {})},
    )
    if result.interrupted:
        report.error = "interrupted: the report holds the points measured before Ctrl-C"
        report.meta["interrupted"] = True  # exit 130
    xs, ys = worker_curve(result)
    blocks = [
        line_chart(
            "batches/s by num_workers", xs, {"batches/s": ys}, xlabel="num_workers", ylabel="batches/s"
        ),
        table("Measured DataLoader settings", SWEEP_HEADERS, sweep_rows(result)),
    ]
    return report, blocks


def batch_size_report(
    result: BatchSizeResult, meta: dict[str, Any] | None = None
) -> tuple[Report, list[Block]]:
    report = Report(
        tool="tune batch-size",
        findings=batch_size_findings(result),
        sections={"batch_size": result.to_dict()},
        meta=meta or {},
    )
    if result.interrupted:
        report.error = "interrupted: the report holds the sizes measured before Ctrl-C"
        report.meta["interrupted"] = True  # exit 130
    rows = [
        [
            t.batch_size,
            t.status,
            None if t.peak_bytes is None else round(t.peak_bytes / MiB, 1),
            None if t.samples_per_s is None else round(t.samples_per_s, 1),
            t.reason,
        ]
        for t in result.trials
    ]
    fits = sorted((t for t in result.trials if t.fits and t.samples_per_s), key=lambda t: t.batch_size)
    blocks = [
        table(
            f"Batch sizes tried (budget {result.budget_bytes / MiB:.0f} MiB, {result.memory_measure})",
            ["batch size", "status", "peak MiB", "samples/s", "note"],
            rows,
        ),
        line_chart(
            "samples/s by batch size",
            [float(t.batch_size) for t in fits],
            {"samples/s": [float(t.samples_per_s or 0.0) for t in fits]},
            xlabel="batch size",
            ylabel="samples/s",
        ),
    ]
    return report, blocks


def lr_plot_series(result: LRResult) -> dict[str, list[float]]:
    """Smoothed and raw loss; raw values past 1.5x the smoothed maximum (the divergence spike) are left
    out so the interesting part of the curve keeps its scale."""
    finite = [v for v in result.smoothed if math.isfinite(v)]
    cap = 1.5 * max(finite) if finite else math.inf
    raw = [v if math.isfinite(v) and v <= cap else math.nan for v in result.losses]
    return {"loss (smoothed)": list(result.smoothed), "loss": raw}


def lr_report(result: LRResult, meta: dict[str, Any] | None = None) -> tuple[Report, list[Block]]:
    report = Report(
        tool="tune lr", findings=lr_findings(result), sections={"lr_range": result.to_dict()}, meta=meta or {}
    )
    if result.stop == "interrupted":
        report.error = "interrupted: the report holds the steps measured before Ctrl-C"
        report.meta["interrupted"] = True  # exit 130
    xs = [math.log10(lr) for lr in result.lrs]
    blocks = [
        line_chart(
            "LR range test: loss vs log10(lr)",
            xs,
            lr_plot_series(result),
            xlabel="log10(learning rate)",
            ylabel="loss",
            zero=False,  # a loss: the axis spans the losses
        )
    ]
    return report, blocks
