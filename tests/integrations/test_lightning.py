"""pitstop.integrations.lightning.PitstopCallback on a real (tiny, CPU) Lightning fit."""

from __future__ import annotations

import csv
import json

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

L = pytest.importorskip("lightning.pytorch")
from lightning.pytorch.loggers import CSVLogger  # noqa: E402

from pitstop.integrations.lightning import PitstopCallback  # noqa: E402

torch.set_num_threads(1)


class Tiny(L.LightningModule):
    def __init__(self, dataset) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
        self.dataset = dataset

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        return DataLoader(self.dataset, batch_size=4)  # LOADER


def fit(tmp_path, callback, max_steps, **kw):
    kw.setdefault("logger", CSVLogger(tmp_path, name="run"))
    trainer = L.Trainer(
        max_steps=max_steps,
        accelerator="cpu",
        devices=1,
        callbacks=[callback] if callback is not None else [],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        default_root_dir=tmp_path,
        **kw,
    )
    return trainer


@pytest.mark.slow
def test_profiles_the_window_writes_reports_and_logs_metrics(tmp_path, slow_dataset, unpatched, line_of):
    cb = PitstopCallback(start_step=2, stop_step=8, probes=False)
    model = Tiny(slow_dataset(n=128))
    trainer = fit(tmp_path, cb, max_steps=14)
    trainer.fit(model)
    assert trainer.global_step == 14  # the fit went on after the window
    report = cb.report
    assert report is not None and report.meta["measured_steps"] == 6 and report.meta["warmup_steps"] == 2
    top = report.ranked()[0]
    assert top.id == "dataloader.workers"
    assert top.location.endswith("test_lightning.py:" + str(line_of("# LOADER")))
    bd = report.sections["breakdown"]
    # forward and backward run inside optimizer.step(closure): they are not counted as optimizer time
    assert bd["optimizer_s"] < bd["forward_s"] + bd["backward_s"] + bd["data_wait_s"]
    log_dir = trainer.log_dir
    doc = json.loads((tmp_path / "run" / "version_0" / "pitstop-profile.json").read_text())
    assert log_dir.endswith("version_0") and doc["meta"]["measured_steps"] == 6
    assert (tmp_path / "run" / "version_0" / "pitstop-profile.html").read_text().startswith("<!DOCTYPE html>")
    rows = list(csv.DictReader((tmp_path / "run" / "version_0" / "metrics.csv").open()))
    logged = [r for r in rows if r.get("pitstop/step_ms")]
    assert len(logged) == 1
    assert float(logged[0]["pitstop/step_ms"]) == pytest.approx(1000 * bd["median_step_s"])
    assert float(logged[0]["pitstop/data_wait_ms"]) == pytest.approx(1000 * bd["data_wait_s"])


@pytest.mark.slow
def test_stop_ends_the_fit_after_the_window(tmp_path, slow_dataset, unpatched):
    cb = PitstopCallback(start_step=1, stop_step=4, probes=False, stop=True)
    trainer = fit(tmp_path, cb, max_steps=50)
    trainer.fit(Tiny(slow_dataset(n=256, delay_s=0.0)))
    assert cb.report is not None and cb.report.meta["measured_steps"] == 3
    assert trainer.global_step < 50


@pytest.mark.slow
def test_loaders_passed_to_fit_are_measured_too(tmp_path, slow_dataset, unpatched):
    cb = PitstopCallback(start_step=1, stop_step=5, probes=False)
    model = Tiny(None)
    trainer = fit(tmp_path, cb, max_steps=6)
    trainer.fit(model, train_dataloaders=DataLoader(slow_dataset(n=64), batch_size=4))
    (ld,) = cb.report.sections["loaders"]
    assert ld["batches_seen"] >= 5 and ld["num_workers"] == 0
    assert cb.report.ranked()[0].id == "dataloader.workers"


@pytest.mark.slow
def test_a_fit_with_the_callback_and_its_probes_trains_the_same_weights(tmp_path, slow_dataset, unpatched):
    def final_weights(callback):
        L.seed_everything(3, verbose=False)
        model = Tiny(slow_dataset(n=64, delay_s=0.0))
        fit(tmp_path, callback, max_steps=10, logger=False).fit(model)
        return {k: v.clone() for k, v in model.state_dict().items()}

    cb = PitstopCallback(start_step=1, stop_step=4)  # probes on: they run mid-fit, after step 4
    with_cb = final_weights(cb)
    assert "probes" in cb.report.sections
    without = final_weights(None)
    assert with_cb.keys() == without.keys()
    assert all(torch.equal(with_cb[k], without[k]) for k in with_cb)
    assert (tmp_path / "pitstop-profile.json").exists()  # no logger: the trainer's root dir


@pytest.mark.slow
def test_exports_into_the_trainers_tensorboard_logger(tmp_path, slow_dataset, unpatched):
    pytest.importorskip("tensorboard")
    from lightning.pytorch.loggers import TensorBoardLogger
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cb = PitstopCallback(start_step=2, stop_step=6, probes=False)
    logger = TensorBoardLogger(tmp_path, name="tb")
    fit(tmp_path, cb, max_steps=8, logger=logger).fit(Tiny(slow_dataset(n=64)))
    n = len(cb.report.sections["steps"])
    acc = EventAccumulator(logger.log_dir)
    acc.Reload()
    assert [e.step for e in acc.Scalars("pitstop/step_ms/data_wait")] == list(range(n))
    # the summary at the trainer's step, where the metrics logged as before are
    assert acc.Scalars("pitstop/steps_per_s")[0].step == acc.Scalars("pitstop/step_ms")[0].step >= 6
    texts = {tag: acc.Tensors(tag)[-1].tensor_proto.string_val[0].decode() for tag in acc.Tags()["tensors"]}
    assert "`dataloader.workers`" in texts["pitstop/findings/text_summary"]
    assert "Data wait" in texts["pitstop/headline/text_summary"]
