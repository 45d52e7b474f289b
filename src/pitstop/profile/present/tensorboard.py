"""The TensorBoard sink: ``--tensorboard DIR``, ``Profiler(tensorboard=DIR)`` and the trainers' writers.

Scalars: each step's time and its parts (``pitstop/step_ms/<part>``, x = the step's index, warm-up steps
included and flagged by ``pitstop/warmup``), the mean step and its parts (``pitstop/mean_step_ms/...``),
the median step, steps/s and each finding's measured cost per step (``pitstop/finding_cost_ms/<id>``),
at the export's step. Text: the headline and the findings as a markdown table, in the report's order.
Written with ``torch.utils.tensorboard``, which needs the ``tensorboard`` package: the optional
``[tensorboard]`` extra. Without it the option says how to install it instead of raising ImportError.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pitstop.findings import Report
from pitstop.profile.present.export import ExportData, export_data

INSTALL = "pip install 'pitstop[tensorboard]'"
TAG = "pitstop"


def unavailable(what: str = "--tensorboard") -> str | None:
    """The message for ``what`` where TensorBoard's writer cannot be imported, else None."""
    try:
        from torch.utils.tensorboard import SummaryWriter  # noqa: F401
    except ImportError:
        return f"{what} needs tensorboard: {INSTALL}"
    return None


class TensorBoardSink:
    """Writes into ``writer`` (a trainer's own ``SummaryWriter``: flushed, left open) or a new writer on
    ``log_dir`` (closed after)."""

    name = "TensorBoard"

    def __init__(self, log_dir: str | Path | None = None, writer: Any = None) -> None:
        if (log_dir is None) == (writer is None):
            raise ValueError("give either log_dir or writer")
        self.log_dir, self.writer = log_dir, writer

    def write(self, data: ExportData, step: int) -> str:
        if self.writer is not None:
            _write(self.writer, data, step)
            self.writer.flush()
            return f"TensorBoard {getattr(self.writer, 'log_dir', '')}".rstrip()
        from torch.utils.tensorboard import SummaryWriter

        writer = SummaryWriter(log_dir=str(self.log_dir))
        try:
            _write(writer, data, step)
        finally:
            writer.close()
        return f"TensorBoard {self.log_dir}"


def tensorboard_sink(log_dir: str | Path) -> TensorBoardSink | str:
    """A sink writing under ``log_dir``, or why there is none (tensorboard not installed)."""
    why = unavailable("the TensorBoard export")
    return TensorBoardSink(log_dir) if why is None else f"{why} (skipped)"


def _write(writer: Any, data: ExportData, step: int) -> None:
    for row in data.steps:
        for key, ms in row.ms.items():
            writer.add_scalar(f"{TAG}/step_ms/{key}", ms, row.index)
        writer.add_scalar(f"{TAG}/warmup", 1.0 if row.warmup else 0.0, row.index)
    for key, value in data.summary.items():
        writer.add_scalar(f"{TAG}/{key}", value, step)
    if data.headline:
        writer.add_text(f"{TAG}/headline", "  \n".join(data.headline), step)
    writer.add_text(f"{TAG}/findings", data.markdown, step)


def write_tensorboard(report: Report, log_dir: str | Path) -> Path:
    """Write the report's step breakdown and findings under ``log_dir``; returns it."""
    TensorBoardSink(log_dir).write(export_data(report), 0)
    return Path(log_dir)
