"""Exports from where users train (issue 34): ``Profiler(tensorboard=..., export=...)``, and which sinks
the Lightning loggers and HF's ``report_to`` give (the fits that export are in test_lightning.py and
test_transformers.py). TensorBoard is read back with its EventAccumulator; W&B and MLflow are fake
modules whose calls are checked."""

from __future__ import annotations

import os
import types

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from pitstop.integrations.profiler import Profiler

torch.set_num_threads(1)


def events(log_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir))
    acc.Reload()
    return acc


def text(acc, tag: str) -> str:
    return acc.Tensors(f"{tag}/text_summary")[-1].tensor_proto.string_val[0].decode()


def train(loader, steps: int) -> None:
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for n, (x, y) in enumerate(loader, 1):
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()
        if n >= steps:
            break


def test_profiler_exports_to_tensorboard_wandb_and_mlflow_when_asked(
    tmp_path, slow_dataset, unpatched, fake_wandb, fake_mlflow, capsys
):
    pytest.importorskip("tensorboard")
    loader = DataLoader(slow_dataset(n=64), batch_size=4)
    with Profiler(
        steps=4, warmup=1, probes=False, tensorboard=tmp_path / "tb", export=("wandb", "mlflow")
    ) as p:
        train(loader, steps=8)
    n = len(p.report().sections["steps"])
    acc = events(tmp_path / "tb")
    assert [e.step for e in acc.Scalars("pitstop/step_ms/data_wait")] == list(range(n))
    assert "pitstop/finding_cost_ms/dataloader.workers" in acc.Tags()["scalars"]
    assert "`dataloader.workers`" in text(acc, "pitstop/findings")
    assert len([d for d in fake_wandb.run.logged if "pitstop/step" in d]) == n
    assert any("pitstop/findings" in d for d in fake_wandb.run.logged)
    assert [c[0] for c in fake_mlflow.client.calls][-3:] == ["log_text", "log_text", "log_table"]
    assert capsys.readouterr().err == ""


def test_profiler_exports_nothing_unless_asked(
    tmp_path, slow_dataset, unpatched, fake_wandb, fake_mlflow, capsys
):
    with Profiler(steps=2, warmup=1, probes=False):
        train(DataLoader(slow_dataset(n=16, delay_s=0.0), batch_size=4), steps=3)
    assert fake_wandb.run.logged == [] and fake_mlflow.client.calls == []
    assert capsys.readouterr().err == ""
    with pytest.raises(ValueError, match="export takes wandb and mlflow, not comet"):
        Profiler(export=("comet",))  # type: ignore[arg-type]


def test_profiler_export_without_wandb_or_a_run_is_one_line_each(
    monkeypatch, slow_dataset, unpatched, fake_mlflow, capsys
):
    import sys

    monkeypatch.setitem(sys.modules, "wandb", None)
    fake_mlflow.active_run = lambda: None
    with Profiler(steps=2, warmup=1, probes=False, export=("wandb", "mlflow")) as p:
        train(DataLoader(slow_dataset(n=16, delay_s=0.0), batch_size=4), steps=3)
    assert p.report().meta["measured_steps"] == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and "wandb is not installed" in err[0] and "no active run" in err[1]


def test_lightning_loggers_map_to_their_sinks(fake_wandb, fake_mlflow):
    pytest.importorskip("lightning.pytorch")
    from pitstop.integrations.lightning import logger_sinks
    from pitstop.profile.present.mlflow_sink import MlflowSink
    from pitstop.profile.present.tensorboard import TensorBoardSink
    from pitstop.profile.present.wandb_sink import WandbSink

    run, client, writer = object(), object(), object()
    TensorBoardLogger = type("TensorBoardLogger", (), {"experiment": writer})
    MyWandb = type("MyWandb", (type("WandbLogger", (), {}),), {"experiment": run})  # a subclass counts
    MLFlowLogger = type("MLFlowLogger", (), {"experiment": client, "run_id": "lg-run"})
    CSVLogger = type("CSVLogger", (), {})
    tb, wb, ml = logger_sinks([TensorBoardLogger(), MyWandb(), MLFlowLogger(), CSVLogger()])
    assert isinstance(tb, TensorBoardSink) and tb.writer is writer
    assert isinstance(wb, WandbSink) and wb.run is run
    assert isinstance(ml, MlflowSink) and (ml.client, ml.run_id) == (client, "lg-run")


def test_hf_report_to_maps_to_sinks(request):
    pytest.importorskip("transformers")
    from pitstop.integrations.transformers import report_to_sinks

    # after transformers is imported: accelerate's import-time probe for wandb cannot read a fake module
    fake_wandb, _ = request.getfixturevalue("fake_wandb"), request.getfixturevalue("fake_mlflow")
    from pitstop.profile.present.mlflow_sink import MlflowSink
    from pitstop.profile.present.tensorboard import TensorBoardSink
    from pitstop.profile.present.wandb_sink import WandbSink

    args = types.SimpleNamespace(report_to=["tensorboard", "wandb", "mlflow", "comet_ml"], output_dir="out")
    writer = object()
    TensorBoardCallback = type("TensorBoardCallback", (), {"tb_writer": writer})
    handler = types.SimpleNamespace(callbacks=[TensorBoardCallback()])
    tb, wb, ml = report_to_sinks(args, handler)
    assert isinstance(tb, TensorBoardSink) and tb.writer is writer
    assert isinstance(wb, WandbSink) and wb.run is fake_wandb.run
    assert isinstance(ml, MlflowSink) and ml.run_id == "run-1"
    (own,) = report_to_sinks(types.SimpleNamespace(report_to="tensorboard", output_dir="out"))
    assert own.log_dir == os.path.join("out", "runs")
    assert report_to_sinks(types.SimpleNamespace(report_to=[], output_dir="out")) == []
