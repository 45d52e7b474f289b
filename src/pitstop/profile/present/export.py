"""A profile report sent to the tools users keep open: TensorBoard, Weights & Biases, MLflow.

``export_data`` turns the report into what every sink writes: each step's time and its parts in ms (x =
the step's index, warm-up steps included and flagged), the summary scalars (the mean step and its parts,
steps/s, each finding's measured cost per step), the findings as rows (id, severity, cost, share of the
step, confirmed interval) and as a markdown table, and the headline. A sink writes them with its tool's
API: ``profile.tensorboard.TensorBoardSink``, ``profile.wandb_sink.WandbSink``,
``profile.mlflow_sink.MlflowSink``; each module's ``*_sink`` function gives a sink, or the one-line
reason there is none (package not installed, no active run). ``export`` writes to each sink and says in
one line why one was skipped or failed: an export never stops the training it reports on.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from pitstop.findings import Finding, Report, by_area
from pitstop.profile.analyze.headline import confirmed, costed, headline
from pitstop.profile.record.timeline import PART_LABELS, PARTS
from pitstop.report.stacked import cost_text
from pitstop.units import duration

COLUMNS = ("id", "severity", "cost_ms", "share", "ci_low_ms", "ci_high_ms", "confirmed", "title")


def part_key(part: str) -> str:
    """``data_wait_s`` -> ``data_wait``, ``h2d_s`` -> ``host_to_device_copy``: the scalar names' last part."""
    return PART_LABELS[part].replace(" ", "_").replace("-", "_")


@dataclass(frozen=True)
class StepRow:
    index: int
    warmup: bool
    ms: dict[str, float]  # "total", then each part by ``part_key``


@dataclass(frozen=True)
class FindingRow:
    id: str
    severity: str
    title: str
    cost_ms: float | None  # measured per-step cost (``est_saving_s``)
    share: float | None  # of the mean step
    ci_ms: tuple[float, float] | None  # the saving's confirmed interval, where one was measured
    confirmed: bool

    def cells(self) -> list[Any]:
        """The row in ``COLUMNS`` order."""
        lo, hi = self.ci_ms if self.ci_ms else (None, None)
        return [self.id, self.severity, self.cost_ms, self.share, lo, hi, self.confirmed, self.title]


@dataclass(frozen=True)
class ExportData:
    steps: list[StepRow]
    summary: dict[str, float]  # "mean_step_ms/<part>", "steps_per_s", "finding_cost_ms/<id>" ...
    findings: list[FindingRow]
    headline: list[str]
    markdown: str  # the findings table, the terminal's order


class Sink(Protocol):
    name: str

    def write(self, data: ExportData, step: int) -> str:
        """Write ``data`` (summary values at ``step``); returns where it went, for the user."""
        ...


def export_data(report: Report) -> ExportData:
    steps = [_step_row(st) for st in report.sections.get("steps") or []]
    summary: dict[str, float] = {}
    bd = report.sections.get("breakdown") or {}
    if bd.get("mean_step_s"):
        summary["mean_step_ms/total"] = float(bd["mean_step_s"]) * 1e3
        for p in PARTS:
            summary[f"mean_step_ms/{part_key(p)}"] = float(bd.get(p) or 0.0) * 1e3
    if bd.get("median_step_s"):
        summary["median_step_ms"] = float(bd["median_step_s"]) * 1e3
    if report.meta.get("steps_per_s"):
        summary["steps_per_s"] = float(report.meta["steps_per_s"])
    for f in costed(report):
        summary[f"finding_cost_ms/{f.id}"] = float(f.est_saving_s or 0.0) * 1e3
    ordered = [f for _, found in by_area(report.ranked()) for f in found]
    rows = [_finding_row(f) for f in ordered]
    return ExportData(steps, summary, rows, headline(report), findings_markdown(ordered))


def _step_row(st: dict[str, Any]) -> StepRow:
    ms = {"total": float(st.get("total_s") or 0.0) * 1e3}
    ms.update({part_key(p): float(st.get(p) or 0.0) * 1e3 for p in PARTS})
    return StepRow(int(st.get("index", 0)), bool(st.get("warmup")), ms)


def _finding_row(f: Finding) -> FindingRow:
    ci = f.data.get("saving_ci_s") if isinstance(f.data, dict) else None
    band = None
    if isinstance(ci, list | tuple) and len(ci) == 2 and all(isinstance(v, int | float) for v in ci):
        band = (float(ci[0]) * 1e3, float(ci[1]) * 1e3)
    cost = None if f.est_saving_s is None else float(f.est_saving_s) * 1e3
    return FindingRow(f.id, str(f.severity), f.title, cost, f.share, band, confirmed(f))


def findings_markdown(findings: list[Finding]) -> str:
    """The findings as a markdown table (TensorBoard's text plugin and MLflow's viewer render it)."""
    rows = [
        "| severity | finding | cost | confirmed interval | title |",
        "| --- | --- | --- | --- | --- |",
    ]
    for f in findings:
        title = f.title.replace("|", "\\|").replace("\n", " ")
        row = _finding_row(f)
        band = f"{duration(row.ci_ms[0] / 1e3)} – {duration(row.ci_ms[1] / 1e3)}" if row.ci_ms else "–"
        rows.append(f"| {f.severity} | `{f.id}` | {cost_text(f) or '–'} | {band} | {title} |")
    return "\n".join(rows)


def say_stderr(msg: str) -> None:
    print(f"pitstop: {msg}", file=sys.stderr, flush=True)


def export(
    report: Report,
    sinks: Iterable[Sink | str],
    step: int = 0,
    say: Callable[[str], None] = say_stderr,
) -> list[str]:
    """Write ``report`` to each sink (a string stands for a sink that could not be made: it is said);
    returns where it went. A sink that raises is said in one line and the others still run."""
    data: ExportData | None = None
    written: list[str] = []
    for sink in sinks:
        if isinstance(sink, str):
            say(sink)
            continue
        data = data or export_data(report)
        try:
            written.append(sink.write(data, step))
        except Exception as e:  # a tracking server down must not end the training being reported on
            say(f"{sink.name} export failed: {type(e).__name__}: {e}")
    return written
