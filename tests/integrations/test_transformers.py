"""pitstop.integrations.transformers.PitstopCallback on a real HF Trainer fit of a tiny model built from
a config (offline: nothing is downloaded)."""

from __future__ import annotations

import json
import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
transformers = pytest.importorskip("transformers")
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments  # noqa: E402

from pitstop.integrations.transformers import PitstopCallback  # noqa: E402

torch.set_num_threads(1)


class Tokens(torch.utils.data.Dataset):
    """Random token sequences; ``slow`` wraps the planted per-item load cost."""

    def __init__(self, slow, n: int = 128, delay_s: float = 0.004) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, 64, (n, 16), generator=g)
        self.slow = slow(n=n, delay_s=delay_s)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int):
        self.slow[i]
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class Seen(TrainerCallback):
    """Stands for a reporting integration (TensorBoard, W&B): records every log event it receives."""

    def __init__(self) -> None:
        self.logs: list[dict] = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.logs.append(dict(logs or {}))


def make_trainer(tmp_path, callbacks, max_steps, dataset, report_to=()):
    config = GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=1, n_head=2)
    args = TrainingArguments(
        output_dir=str(tmp_path),
        max_steps=max_steps,
        per_device_train_batch_size=4,
        logging_steps=1000,
        save_strategy="no",
        report_to=list(report_to),
        use_cpu=True,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    return Trainer(model=GPT2LMHeadModel(config), args=args, train_dataset=dataset, callbacks=callbacks)


@pytest.mark.slow
def test_profiles_the_window_writes_reports_and_logs_metrics(tmp_path, slow_dataset, unpatched, line_of):
    seen = Seen()
    cb = PitstopCallback(start_step=2, stop_step=8, probes=False)
    trainer = make_trainer(tmp_path, [seen, cb], max_steps=12, dataset=Tokens(slow_dataset))
    trainer.train()  # FIT
    assert trainer.state.global_step == 12
    report = cb.report
    assert report is not None and report.meta["measured_steps"] == 6 and report.meta["warmup_steps"] == 2
    assert report.ranked()[0].id == "dataloader.workers"
    (ld,) = report.sections["loaders"]  # the loader accelerate prepared, the one iterated
    assert (
        ld["batches_seen"] >= 8
        and ld["location"] == f"tests/integrations/test_transformers.py:{line_of('trainer.train()  # FIT')}"
    )
    doc = json.loads((tmp_path / "pitstop-profile.json").read_text())
    assert doc["meta"]["measured_steps"] == 6
    assert (tmp_path / "pitstop-profile.html").exists()
    # the callback that logs (listed before ours) got the metrics in a log event, and so did the history
    bd = report.sections["breakdown"]
    logged = [e for e in seen.logs if "pitstop/step_ms" in e]
    assert len(logged) == 1 and logged[0]["pitstop/step_ms"] == pytest.approx(1000 * bd["median_step_s"])
    assert any("pitstop/data_wait_ms" in e for e in trainer.state.log_history)


@pytest.mark.slow
def test_a_window_past_the_end_reports_what_it_measured(tmp_path, slow_dataset, unpatched):
    cb = PitstopCallback(start_step=1, stop_step=100, probes=False, stop=True)
    trainer = make_trainer(tmp_path, [cb], max_steps=5, dataset=Tokens(slow_dataset, delay_s=0.0))
    trainer.train()
    assert cb.report is not None and cb.report.meta["status"] == "completed"
    assert 3 <= cb.report.meta["measured_steps"] <= 4
    assert any("pitstop/step_ms" in e for e in trainer.state.log_history)


class Boom(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 3:
            raise RuntimeError("boom at step 3")


@pytest.mark.slow
def test_after_train_raises_close_removes_the_instrumentation(tmp_path, slow_dataset, unpatched):
    cb = PitstopCallback(start_step=1, stop_step=50, probes=False)
    trainer = make_trainer(tmp_path, [cb, Boom()], max_steps=20, dataset=Tokens(slow_dataset, delay_s=0.0))
    with pytest.raises(RuntimeError, match="boom") as info:
        trainer.train()
    report = cb.close(info.value)
    assert report.meta["status"] == "error" and "boom at step 3" in report.error
    assert report.meta["measured_steps"] >= 1


@pytest.mark.slow
def test_exports_into_the_tensorboard_of_report_to(tmp_path, slow_dataset, unpatched, monkeypatch):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(tmp_path / "tb"))  # HF's TensorBoard callback's folder
    cb = PitstopCallback(start_step=2, stop_step=6, probes=False)
    trainer = make_trainer(
        tmp_path, [cb], max_steps=8, dataset=Tokens(slow_dataset), report_to=["tensorboard"]
    )
    trainer.train()
    n = len(cb.report.sections["steps"])
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    assert [e.step for e in acc.Scalars("pitstop/step_ms/data_wait")] == list(range(n))
    assert "pitstop/findings/text_summary" in acc.Tags()["tensors"]
    assert "train/pitstop/step_ms" in acc.Tags()["scalars"]  # the log event's metrics, through HF's callback
