"""The export layer: one ExportData from a report, written by the TensorBoard, W&B and MLflow sinks (the
trackers as fake modules: what pitstop calls on them is checked), and a sink that cannot be made or that
fails said in one line."""

from __future__ import annotations

import sys

import pytest

from pitstop.findings import Finding, Report, Severity
from pitstop.profile.present.export import COLUMNS, export, export_data
from pitstop.profile.present.mlflow_sink import mlflow_sink
from pitstop.profile.present.wandb_sink import WandbSink, wandb_sink


def _step(i: int) -> dict:
    wait = 1.6 if i < 2 else 0.9
    parts = {"data_wait_s": wait, "h2d_s": 0.0, "forward_s": 0.04, "backward_s": 0.05}
    parts.update({"optimizer_s": 0.01, "sync_s": 0.0, "other_s": 0.0})
    return {"index": i, "total_s": sum(parts.values()), "warmup": i < 2, **parts}


def report() -> Report:
    steps = [_step(i) for i in range(6)]
    bd = {p: v for p, v in steps[-1].items() if p.endswith("_s") and p != "total_s"}
    bd.update(steps=4, mean_step_s=1.0, median_step_s=1.0)
    findings = [
        Finding(
            id="dataloader.workers",
            severity=Severity.WARN,
            title="Training waits for data",
            est_saving_s=0.9,
            share=0.9,
            data={"confirmed": True, "saving_ci_s": [0.8, 0.95]},
        ),
        Finding(id="precision.amp", severity=Severity.INFO, title="fp32 | no autocast", est_saving_s=0.01),
    ]
    meta = {"steps_per_s": 1.0}
    return Report(tool="profile", findings=findings, sections={"steps": steps, "breakdown": bd}, meta=meta)


def test_export_data_has_each_step_the_summary_and_the_findings_rows():
    data = export_data(report())
    assert [r.index for r in data.steps] == list(range(6)) and data.steps[0].warmup
    assert data.steps[3].ms["data_wait"] == pytest.approx(900.0)
    assert data.steps[3].ms["total"] == pytest.approx(1000.0)
    assert data.summary["mean_step_ms/data_wait"] == pytest.approx(900.0)
    assert data.summary["steps_per_s"] == 1.0
    assert data.summary["finding_cost_ms/dataloader.workers"] == pytest.approx(900.0)
    top = data.findings[0]
    assert top.cells() == ["dataloader.workers", "warn", 900.0, 0.9, 800.0, 950.0, True, top.title]
    assert data.findings[1].ci_ms is None and not data.findings[1].confirmed
    assert "| 900 ms/step (90%) | 800 ms – 950 ms |" in data.markdown
    assert "fp32 \\| no autocast" in data.markdown  # a | in a title does not break the table
    assert data.headline and data.headline[0].startswith("Data wait is 90% of the step")


def test_wandb_sink_logs_each_step_on_its_own_axis_and_the_findings_as_a_table(fake_wandb, capsys):
    sink = wandb_sink()
    assert isinstance(sink, WandbSink)
    assert export(report(), [sink], step=7) == ["W&B run fake-run"]
    run = fake_wandb.run
    assert ("pitstop/step_ms/*", {"step_metric": "pitstop/step"}) in run.defined
    *per_step, final = run.logged
    assert [d["pitstop/step"] for d in per_step] == list(range(6))
    assert per_step[3]["pitstop/step_ms/data_wait"] == pytest.approx(900.0)
    assert [d["pitstop/warmup"] for d in per_step] == [1, 1, 0, 0, 0, 0]
    assert final["pitstop/mean_step_ms/total"] == pytest.approx(1000.0)
    table = final["pitstop/findings"]
    assert table.columns == list(COLUMNS) and [r[0] for r in table.data] == [
        "dataloader.workers",
        "precision.amp",
    ]
    assert run.summary["pitstop/headline"].startswith("Data wait is 90%")
    assert capsys.readouterr().err == ""


def test_mlflow_sink_logs_metrics_text_and_table_to_the_active_run(fake_mlflow):
    assert export(report(), [mlflow_sink()], step=7) == ["MLflow run run-1"]
    calls = fake_mlflow.client.calls
    assert {c[1] for c in calls} == {"run-1"}
    metrics = [m for name, _, batch in calls if name == "log_batch" for m in batch]
    wait = [(m.step, m.value) for m in metrics if m.key == "pitstop.step_ms.data_wait"]
    assert [s for s, _ in wait] == list(range(6)) and wait[3][1] == pytest.approx(900.0)
    cost = next(m for m in metrics if m.key == "pitstop.finding_cost_ms.dataloader.workers")
    assert cost.step == 7 and cost.value == pytest.approx(900.0)
    texts = {p[0]: p[1] for name, _, p in calls if name == "log_text"}
    assert (
        "`dataloader.workers`" in texts["pitstop/findings.md"]
        and "Data wait" in texts["pitstop/headline.txt"]
    )
    ((path, table),) = [p for name, _, p in calls if name == "log_table"]
    assert path == "pitstop/findings.json" and table["id"] == ["dataloader.workers", "precision.amp"]
    assert table["ci_low_ms"] == [800.0, None]


def test_mlflow_sink_on_a_loggers_client_and_run_id(fake_mlflow):
    client = type(fake_mlflow.client)()
    export(report(), [mlflow_sink(client=client, run_id="logger-run")])
    assert client.calls and {c[1] for c in client.calls} == {"logger-run"}
    assert fake_mlflow.client.calls == []  # the active run's client is not used


def test_absent_packages_and_no_active_run_are_one_line_each(monkeypatch, capsys, fake_wandb, fake_mlflow):
    fake_wandb.run = None
    fake_mlflow.active_run = lambda: None
    assert export(report(), [wandb_sink(), mlflow_sink()]) == []
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "pitstop: W&B export skipped: no active run (call wandb.init() before the profiled code)",
        "pitstop: MLflow export skipped: no active run (call mlflow.start_run() before the profiled code)",
    ]
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if not installed
    monkeypatch.setitem(sys.modules, "mlflow", None)
    assert export(report(), [wandb_sink(), mlflow_sink()]) == []
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "pitstop: W&B export skipped: wandb is not installed (pip install wandb)",
        "pitstop: MLflow export skipped: mlflow is not installed (pip install mlflow)",
    ]


def test_a_failing_sink_is_one_line_and_the_others_still_write(fake_wandb, fake_mlflow, capsys):
    def down(values):
        raise ConnectionError("tracking server unreachable")

    fake_wandb.run.log = down
    assert export(report(), [wandb_sink(), mlflow_sink()]) == ["MLflow run run-1"]
    err = capsys.readouterr().err
    assert err == "pitstop: W&B export failed: ConnectionError: tracking server unreachable\n"


def test_tensorboard_sink_without_the_package_is_one_line(monkeypatch, capsys, tmp_path):
    from pitstop.profile.present.tensorboard import tensorboard_sink

    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    assert export(report(), [tensorboard_sink(tmp_path / "tb")]) == []
    err = capsys.readouterr().err
    assert err == (
        "pitstop: the TensorBoard export needs tensorboard: pip install 'pitstop[tensorboard]' (skipped)\n"
    )
    assert not (tmp_path / "tb").exists()
