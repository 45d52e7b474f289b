"""Bench results as a Report (findings + a `bench` section), a table, HTML blocks, a PNG chart and
Markdown. Renders only what the runner measured; it never measures."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from pitstop.bench.configs import MEMORY_CLAIMS
from pitstop.bench.rows import MEASURED, SKIPPED, Row, claim_decision, claim_value, verdict
from pitstop.bench.runner import BenchResult
from pitstop.findings import Finding, Report, Severity
from pitstop.measure import HELPED, UNDECIDED, Interval, format_interval
from pitstop.report.html import Block, bar_chart, table
from pitstop.units import MiB

COLUMNS = (
    "config",
    "settings",
    "samples/s (median)",
    "min-max",
    "vs ref",
    "peak MiB",
    "activations MiB",
    "model GFLOP/s",
    "% of mm peak",
    "claim vs measured",
)


def _mib(b: int | None) -> float | None:
    return None if b is None else b / MiB


def table_rows(result: BenchResult) -> list[list[Any]]:
    """One list per row, in COLUMNS order (numbers stay numbers; renderers format them)."""
    out = []
    for r in result.rows:
        if r.status != MEASURED or r.samples_per_s is None:
            if r.name == "onecycle" and r.status == MEASURED:
                e = r.extra
                out.append(
                    [r.title, r.knobs, None, None, None, None, None, None, None,
                     f"{r.verdict} (median steps {e.get('median_steps_onecycle')} vs {e.get('median_steps_steplr')})"]
                )  # fmt: skip
                continue
            out.append([r.title, r.knobs, None, None, None, None, None, None, None, r.verdict or r.reason])
            continue
        ratio = None if r.speedup is None else r.speedup
        rng = f"{r.samples_per_s_min:.3g}-{r.samples_per_s_max:.3g}"
        gflops = None if r.model_flops_per_s is None else r.model_flops_per_s / 1e9
        frac = None if r.peak_fraction is None else 100 * r.peak_fraction
        ref = f" vs {r.ref}" if r.ref and r.ref != "baseline" else ""
        note = r.verdict + (f" [{r.reason}]" if r.reason and r.status == MEASURED and not r.verdict else "")
        out.append(
            [r.title, r.knobs, r.samples_per_s, rng, None if ratio is None else f"{ratio:.2f}x{ref}",
             _mib(r.peak_mem_bytes), _mib(r.activation_bytes), gflops, frac, note]
        )  # fmt: skip
    return out


def _severity(row: Row) -> Severity:
    if row.status == SKIPPED:
        return Severity.INFO
    if row.status != MEASURED:
        return Severity.WARN
    v, c = claim_value(row), row.claim
    if c is None or v is None or c.low is None or c.high is None:
        return Severity.INFO
    if (decision := claim_decision(row)) is not None:  # timed: a pass needs an interval that decides it
        return Severity.PASS if decision == HELPED else Severity.INFO
    lower_is_better = c.metric in ("memory", "activations", "steps")
    meets = v <= c.high if lower_is_better else v >= c.low
    return Severity.PASS if meets else Severity.INFO


def findings(result: BenchResult) -> list[Finding]:
    """One finding per claim: the guide's claim next to what this machine measured."""
    rows = list(result.rows)
    for r in result.rows:  # a second claim on the same measurements (AMP's memory promise)
        if r.name in MEMORY_CLAIMS:
            second = replace(r, name=f"{r.name}_memory", claim=MEMORY_CLAIMS[r.name])
            second.verdict = verdict(second)
            rows.append(second)
    out = []
    for r in rows:
        if r.claim is None:
            continue
        data = {
            "status": r.status,
            "measured": claim_value(r),
            "metric": r.claim.metric,
            "claim_low": r.claim.low,
            "claim_high": r.claim.high,
            "samples_per_s": r.samples_per_s,
            "speedup": r.speedup,
            "speedup_interval": r.speedup_interval,
            "memory_ratio": r.memory_ratio,
            "activation_ratio": r.activation_ratio,
            "ref": r.ref,
        }
        evidence = r.verdict or r.reason
        if r.status == MEASURED and r.samples_per_s is not None:
            evidence += (
                f"; {r.samples_per_s:.3g} samples/s median of {len(r.block_step_s)} blocks x {r.steps_per_block}"
                f" steps (ref {r.ref}: {r.ref_samples_per_s or 0:.3g})"
            )
            if r.speedup_interval:
                evidence += f"; speed-up {format_interval(Interval(**r.speedup_interval))}"
        out.append(
            Finding(
                id=f"bench.{r.name}",
                severity=_severity(r),
                title=f"{r.title}: {r.claim.text}",
                evidence=evidence,
                data=data,
                fix=r.reason
                if r.status != MEASURED
                else "More timed blocks (`--repeats`, a longer `--budget`) narrow the interval until it decides."
                if claim_decision(r) == UNDECIDED
                else "",
            )
        )
    return out


def to_report(result: BenchResult) -> Report:
    from pitstop.host.machine import describe_machine

    o = result.options
    report = Report("bench", findings(result))
    report.meta = {
        "workload": result.workload,
        "device": result.device,
        "threads": result.threads,
        "steps_per_block": result.steps,
        "repeats": result.repeats_done,
        "budget_s": o.budget_s,
        "elapsed_s": round(result.phases_s.get("total", 0.0), 1),
        "interrupted": result.interrupted,
        "load_avg": result.load_avg,
        "other_cpu_share": result.other_cpu_share,
        "machine": describe_machine(),
    }
    report.sections["bench"] = {
        "columns": list(COLUMNS),
        "table": table_rows(result),
        "rows": [r.to_dict() for r in result.rows],
        "peaks_flops_per_s": result.peaks,
        "flops_per_sample": result.flops_per_sample,
        "phases_s": result.phases_s,
        "schedules": None if result.schedules is None else vars(result.schedules),
        "options": vars(o),
        "notes": result.notes,
    }
    if result.interrupted:
        report.error = "interrupted: the rows measured so far are reported"
    return report


def _cell(v: Any) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.3g}"
    return str(v)


def print_table(result: BenchResult, console: Any = None) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = console or Console()
    t = Table(
        title=f"pitstop bench: {result.workload} on {result.device}, {result.threads} threads", expand=True
    )
    for c in COLUMNS:
        t.add_column(c, overflow="fold")
    for row in table_rows(result):
        t.add_row(*(Text(_cell(v)) for v in row))
    console.print(t)
    peaks = ", ".join(f"{k} {v / 1e9:.1f} GFLOP/s" for k, v in result.peaks.items())
    console.print(f"torch.mm peak measured in this run: {peaks}")


def html_blocks(result: BenchResult) -> list[Block]:
    measured = [r for r in result.rows if r.status == MEASURED and r.samples_per_s]
    blocks = [
        table("Ablation (measured in this run)", COLUMNS, [[_cell(v) for v in r] for r in table_rows(result)]),
        bar_chart("Throughput", [r.title for r in measured], [r.samples_per_s or 0.0 for r in measured], "samples/s"),
        bar_chart(
            "Speed-up vs reference", [r.title for r in measured if r.speedup], [r.speedup or 0.0 for r in measured if r.speedup], "x"
        ),
    ]  # fmt: skip
    if result.peaks:
        blocks.append(
            table("Matmul peak (torch.mm, this run)", ["dtype", "GFLOP/s"], [[k, v / 1e9] for k, v in result.peaks.items()])
        )  # fmt: skip
    return blocks


def write_png(result: BenchResult, path: str | os.PathLike[str]) -> Path:
    """Bar chart of speed-up (and activation-memory ratio) per config, with the claim ranges shaded."""
    from pitstop.plotting import matplotlib_agg

    matplotlib_agg()
    import matplotlib.pyplot as plt

    rows = [r for r in result.rows if r.status == MEASURED and (r.speedup or r.activation_ratio)]
    fig, axes = plt.subplots(1, 2, figsize=(12, 0.45 * max(4, len(rows)) + 1.5))
    for ax, attr, label in (
        (axes[0], "speedup", "speed-up vs ref (x)"),
        (axes[1], "activation_ratio", "activation memory vs ref (x)"),
    ):
        names = [r.title for r in rows]
        vals = [getattr(r, attr) or 0.0 for r in rows]
        ax.barh(names, vals, color="#4e79a7")
        for i, r in enumerate(rows):
            c = r.claim
            metric = "speedup" if attr == "speedup" else "activations"
            if c and c.metric == metric and c.low is not None and c.high is not None:
                ax.plot([c.low, c.high], [i, i], color="#e15759", linewidth=6, alpha=0.5)
        ax.axvline(1.0, color="#888", linewidth=1)
        ax.set_xlabel(label)
        ax.invert_yaxis()
    axes[1].set_yticklabels([])
    fig.suptitle(f"pitstop bench: {result.workload} ({result.device}); red: the guides' claim")
    fig.tight_layout()
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(p, dpi=110)
    plt.close(fig)
    return p


def markdown(result: BenchResult, headers: Sequence[str] = COLUMNS) -> str:
    def esc(s: str) -> str:
        return s.replace("|", "\\|")

    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    for row in table_rows(result):
        lines.append("| " + " | ".join(esc(_cell(v)) for v in row) + " |")
    peaks = ", ".join(f"{k} {v / 1e9:.1f} GFLOP/s" for k, v in result.peaks.items())
    return "\n".join(lines) + f"\n\ntorch.mm peak measured in the same run: {peaks}\n"
