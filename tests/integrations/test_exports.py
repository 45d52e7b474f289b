"""Exports from where users train (issue 34): ``Profiler(tensorboard=..., export=...)``, the Lightning
callback into the trainer's loggers, the HF callback into ``report_to``. TensorBoard is read back with
its EventAccumulator; W&B and MLflow are fake modules whose calls are checked."""

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


# ---------------------------------------------------------------------------------------------- Lightning


def test_lightning_loggers_map_to_their_sinks(fake_wandb, fake_mlflow):
    pytest.importorskip("lightning.pytorch")
    from pitstop.integrations.lightning import logger_sinks
    from pitstop.report.mlflow_sink import MlflowSink
    from pitstop.report.tensorboard import TensorBoardSink
    from pitstop.report.wandb_sink import WandbSink

    run, client, writer = object(), object(), object()
    TensorBoardLogger = type("TensorBoardLogger", (), {"experiment": writer})
    MyWandb = type("MyWandb", (type("WandbLogger", (), {}),), {"experiment": run})  # a subclass counts
    MLFlowLogger = type("MLFlowLogger", (), {"experiment": client, "run_id": "lg-run"})
    CSVLogger = type("CSVLogger", (), {})
    tb, wb, ml = logger_sinks([TensorBoardLogger(), MyWandb(), MLFlowLogger(), CSVLogger()])
    assert isinstance(tb, TensorBoardSink) and tb.writer is writer
    assert isinstance(wb, WandbSink) and wb.run is run
    assert isinstance(ml, MlflowSink) and (ml.client, ml.run_id) == (client, "lg-run")


@pytest.mark.slow
def test_lightning_callback_exports_into_the_trainers_tensorboard_logger(tmp_path, slow_dataset, unpatched):
    L = pytest.importorskip("lightning.pytorch")
    pytest.importorskip("tensorboard")
    from lightning.pytorch.loggers import TensorBoardLogger

    from pitstop.integrations.lightning import PitstopCallback

    class Tiny(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Linear(8, 2)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return nn.functional.cross_entropy(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

        def train_dataloader(self):
            return DataLoader(slow_dataset(n=64), batch_size=4)

    cb = PitstopCallback(start_step=2, stop_step=6, probes=False)
    logger = TensorBoardLogger(tmp_path, name="tb")
    trainer = L.Trainer(
        max_steps=8,
        accelerator="cpu",
        devices=1,
        callbacks=[cb],
        logger=logger,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Tiny())
    n = len(cb.report.sections["steps"])
    acc = events(logger.log_dir)
    assert [e.step for e in acc.Scalars("pitstop/step_ms/data_wait")] == list(range(n))
    # the summary at the trainer's step, where the metrics logged as before are
    assert acc.Scalars("pitstop/steps_per_s")[0].step == acc.Scalars("pitstop/step_ms")[0].step >= 6
    assert "`dataloader.workers`" in text(acc, "pitstop/findings")
    assert "Data wait" in text(acc, "pitstop/headline")


# ------------------------------------------------------------------------------------------- HF Trainer


def test_hf_report_to_maps_to_sinks(request):
    pytest.importorskip("transformers")
    from pitstop.integrations.transformers import report_to_sinks

    # after transformers is imported: accelerate's import-time probe for wandb cannot read a fake module
    fake_wandb, _ = request.getfixturevalue("fake_wandb"), request.getfixturevalue("fake_mlflow")
    from pitstop.report.mlflow_sink import MlflowSink
    from pitstop.report.tensorboard import TensorBoardSink
    from pitstop.report.wandb_sink import WandbSink

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


@pytest.mark.slow
def test_hf_callback_exports_into_the_tensorboard_of_report_to(
    tmp_path, slow_dataset, unpatched, monkeypatch
):
    pytest.importorskip("tensorboard")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    transformers = pytest.importorskip("transformers")
    from pitstop.integrations.transformers import PitstopCallback

    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(tmp_path / "tb"))
    data = slow_dataset(n=64)

    class Rows(torch.utils.data.Dataset):
        def __len__(self):
            return len(data)

        def __getitem__(self, i):
            x, y = data[i]
            return {"x": x, "labels": y}

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Linear(8, 2)

        def forward(self, x, labels):
            return {"loss": nn.functional.cross_entropy(self.net(x), labels)}

    cb = PitstopCallback(start_step=2, stop_step=6, probes=False)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path),
        max_steps=8,
        per_device_train_batch_size=4,
        report_to=["tensorboard"],
        save_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
        remove_unused_columns=False,
    )
    transformers.Trainer(model=Model(), args=args, train_dataset=Rows(), callbacks=[cb]).train()
    n = len(cb.report.sections["steps"])
    acc = events(tmp_path / "tb")
    assert [e.step for e in acc.Scalars("pitstop/step_ms/data_wait")] == list(range(n))
    assert "`dataloader.workers`" in text(acc, "pitstop/findings")
