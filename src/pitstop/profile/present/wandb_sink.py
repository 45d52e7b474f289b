"""The Weights & Biases sink: a run the user (or the trainer's ``WandbLogger`` / ``report_to="wandb"``)
already started; pitstop never starts one, and ``wandb`` is not a dependency.

Each step is one ``run.log`` with its own x axis (``pitstop/step``, declared with ``define_metric``, so the
trainer's step axis is left alone): ``pitstop/step_ms/<part>`` and ``pitstop/warmup``. Then one
``run.log`` with the summary scalars (``pitstop/mean_step_ms/...``, ``pitstop/steps_per_s``,
``pitstop/finding_cost_ms/<id>``) and the findings as a ``wandb.Table`` (``pitstop/findings``), and the
headline in the run's summary (``pitstop/headline``).
"""

from __future__ import annotations

from typing import Any

from pitstop.profile.present.export import COLUMNS, ExportData

PREFIX = "pitstop/"


class WandbSink:
    name = "W&B"

    def __init__(self, run: Any, table: Any) -> None:
        self.run, self.table = run, table  # table: wandb.Table

    def write(self, data: ExportData, step: int) -> str:
        run = self.run
        if data.steps:
            run.define_metric(f"{PREFIX}step", hidden=True)
            for name in ("step_ms/*", "warmup"):
                run.define_metric(f"{PREFIX}{name}", step_metric=f"{PREFIX}step")
        for row in data.steps:
            logged = {f"{PREFIX}step_ms/{k}": v for k, v in row.ms.items()}
            run.log({f"{PREFIX}step": row.index, f"{PREFIX}warmup": int(row.warmup), **logged})
        final: dict[str, Any] = {f"{PREFIX}{k}": v for k, v in data.summary.items()}
        final[f"{PREFIX}findings"] = self.table(
            columns=list(COLUMNS), data=[r.cells() for r in data.findings]
        )
        run.log(final)
        if data.headline:
            run.summary[f"{PREFIX}headline"] = "\n".join(data.headline)
        return f"W&B run {getattr(run, 'name', None) or getattr(run, 'id', '')}".rstrip()


def wandb_sink(run: Any = None) -> WandbSink | str:
    """A sink on ``run`` (default: the active ``wandb.run``), or why there is none."""
    try:
        import wandb
    except ImportError:
        return "W&B export skipped: wandb is not installed (pip install wandb)"
    run = run if run is not None else getattr(wandb, "run", None)
    if run is None:
        return "W&B export skipped: no active run (call wandb.init() before the profiled code)"
    return WandbSink(run, wandb.Table)
