"""Measured tune results -> Report (findings + sections) and HTML blocks. Builds data; never measures."""

from __future__ import annotations

import math
from typing import Any

from pitstop.findings import Report
from pitstop.report.html import Block, line_chart, table
from pitstop.tune.batch_size import BatchSizeResult, batch_size_findings
from pitstop.tune.loader import SWEEP_HEADERS, LoaderTuneResult, sweep_rows, worker_curve
from pitstop.tune.lr import LRResult, lr_findings

MiB = 2**20


def loader_report(result: LoaderTuneResult, meta: dict[str, Any] | None = None) -> tuple[Report, list[Block]]:
    report = Report(
        tool="tune loader",
        findings=list(result.findings),
        sections={"loader_tune": result.to_dict()},
        meta={**result.meta, **(meta or {})},
    )
    if result.interrupted:
        report.error = "interrupted: the report holds the points measured before Ctrl-C"
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
    xs = [math.log10(lr) for lr in result.lrs]
    blocks = [
        line_chart(
            "LR range test: loss vs log10(lr)",
            xs,
            lr_plot_series(result),
            xlabel="log10(learning rate)",
            ylabel="loss",
        )
    ]
    return report, blocks
