"""The MLflow sink: a run the user (or the trainer's ``MLFlowLogger`` / ``report_to="mlflow"``) already
started; pitstop never starts one, and ``mlflow`` is not a dependency.

Written through ``MlflowClient`` on the run's id (the fluent API's active run, or the id a logger holds):
each step's time and parts as metrics at the step's index (``pitstop.step_ms.<part>``,
``pitstop.warmup``), the summary scalars at the export's step (``pitstop.mean_step_ms.<part>``,
``pitstop.steps_per_s``, ``pitstop.finding_cost_ms.<id>``), and as artifacts the headline and findings
table as text (``pitstop/headline.txt``, ``pitstop/findings.md``) and the findings as a table
(``pitstop/findings.json``, ``log_table``).
"""

from __future__ import annotations

import time
from typing import Any

from pitstop.profile.present.export import COLUMNS, ExportData

BATCH = 1000  # MLflow's limit on metrics per log_batch


def key(name: str) -> str:
    return "pitstop." + name.replace("/", ".")


class MlflowSink:
    name = "MLflow"

    def __init__(self, client: Any, run_id: str, metric: Any) -> None:
        self.client, self.run_id, self.metric = client, run_id, metric  # metric: mlflow.entities.Metric

    def write(self, data: ExportData, step: int) -> str:
        now = int(time.time() * 1000)
        metrics = []
        for row in data.steps:
            values = {f"step_ms/{k}": v for k, v in row.ms.items()}
            values["warmup"] = float(row.warmup)
            metrics += [self.metric(key(k), float(v), now, row.index) for k, v in values.items()]
        metrics += [self.metric(key(k), float(v), now, step) for k, v in data.summary.items()]
        for i in range(0, len(metrics), BATCH):
            self.client.log_batch(self.run_id, metrics=metrics[i : i + BATCH])
        if data.headline:
            self.client.log_text(self.run_id, "\n".join(data.headline), "pitstop/headline.txt")
        self.client.log_text(self.run_id, data.markdown, "pitstop/findings.md")
        table = {c: [r.cells()[i] for r in data.findings] for i, c in enumerate(COLUMNS)}
        self.client.log_table(self.run_id, data=table, artifact_file="pitstop/findings.json")
        return f"MLflow run {self.run_id}"


def mlflow_sink(client: Any = None, run_id: str | None = None) -> MlflowSink | str:
    """A sink on ``client`` and ``run_id`` (a logger's), else on the active run, or why there is none."""
    try:
        import mlflow
        from mlflow.entities import Metric
    except ImportError:
        return "MLflow export skipped: mlflow is not installed (pip install mlflow)"
    if client is None or run_id is None:
        run = mlflow.active_run()
        if run is None:
            return "MLflow export skipped: no active run (call mlflow.start_run() before the profiled code)"
        client, run_id = mlflow.MlflowClient(), run.info.run_id
    return MlflowSink(client, run_id, Metric)
