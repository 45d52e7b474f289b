"""``--tensorboard DIR``: a report where users already look, as TensorBoard event files.

Scalars: each step's time and its parts (``pitstop/step_ms/<part>``, x = the step's index, warm-up steps
included and flagged by ``pitstop/warmup``), the mean step and its parts (``pitstop/mean_step_ms/...``),
and each finding's measured cost per step (``pitstop/finding_cost_ms/<id>``). Text: the headline and the
findings as a markdown table, in the report's order. Written with ``torch.utils.tensorboard``, which needs
the ``tensorboard`` package: the optional ``[tensorboard]`` extra. Without it the option says how to
install it instead of raising ImportError.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pitstop.findings import Report, by_area
from pitstop.profile.headline import costed, headline
from pitstop.profile.timeline import PART_LABELS, PARTS
from pitstop.report.stacked import cost_text

INSTALL = "pip install 'pitstop[tensorboard]'"
TAG = "pitstop"


def unavailable() -> str | None:
    """The message for ``--tensorboard`` where TensorBoard's writer cannot be imported, else None."""
    try:
        from torch.utils.tensorboard import SummaryWriter  # noqa: F401
    except ImportError:
        return f"--tensorboard needs tensorboard: {INSTALL}"
    return None


def _key(label: str) -> str:
    return label.replace(" ", "_").replace("-", "_")


def findings_markdown(report: Report) -> str:
    """The findings as a markdown table (TensorBoard's text plugin renders it), the terminal's order."""
    rows = ["| severity | finding | cost | title |", "| --- | --- | --- | --- |"]
    for _, found in by_area(report.ranked()):
        for f in found:
            title = f.title.replace("|", "\\|").replace("\n", " ")
            rows.append(f"| {f.severity} | `{f.id}` | {cost_text(f) or '–'} | {title} |")
    return "\n".join(rows)


def write_tensorboard(report: Report, log_dir: str | Path) -> Path:
    """Write the report's step breakdown and findings under ``log_dir``; returns it."""
    from torch.utils.tensorboard import SummaryWriter

    out = Path(log_dir)
    writer = SummaryWriter(log_dir=str(out))
    try:
        steps: list[dict[str, Any]] = list(report.sections.get("steps") or [])
        for st in steps:
            i = int(st.get("index", 0))
            writer.add_scalar(f"{TAG}/step_ms/total", float(st.get("total_s") or 0.0) * 1e3, i)
            for p in PARTS:
                writer.add_scalar(f"{TAG}/step_ms/{_key(PART_LABELS[p])}", float(st.get(p) or 0.0) * 1e3, i)
            writer.add_scalar(f"{TAG}/warmup", 1.0 if st.get("warmup") else 0.0, i)
        bd = report.sections.get("breakdown") or {}
        if bd.get("mean_step_s"):
            writer.add_scalar(f"{TAG}/mean_step_ms/total", float(bd["mean_step_s"]) * 1e3, 0)
            for p in PARTS:
                writer.add_scalar(
                    f"{TAG}/mean_step_ms/{_key(PART_LABELS[p])}", float(bd.get(p) or 0.0) * 1e3, 0
                )
        for f in costed(report):
            writer.add_scalar(f"{TAG}/finding_cost_ms/{f.id}", float(f.est_saving_s or 0.0) * 1e3, 0)
        lines = headline(report)
        if lines:
            writer.add_text(f"{TAG}/headline", "  \n".join(lines), 0)
        writer.add_text(f"{TAG}/findings", findings_markdown(report), 0)
    finally:
        writer.close()
    return out
