"""Framework training loops (Lightning, HF Transformers Trainer, HF Accelerate) and the public-style
word-level LSTM language model: the planted cause comes first, forward and backward are where the
framework runs them, and the parts of each step add up to it."""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import pytest

from pitstop.profile.record.timeline import PARTS, usable_steps
from pitstop.profile.runs.runner import RunSpec, run

pytestmark = pytest.mark.slow
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def line_of(name: str, needle: str) -> int:
    lines = (EXAMPLES / name).read_text().splitlines()
    return next(i for i, text in enumerate(lines, 1) if needle in text)


def profile(tmp_path, name: str, *args: str, steps: int = 6):
    spec = RunSpec(
        command=[sys.executable, str(EXAMPLES / name), *args],
        steps=steps,
        warmup=2,
        quiet=True,
        probes=False,
        cwd=str(tmp_path),
        env={"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"},
    )
    result = run(spec, out_dir=tmp_path / "run")
    assert result.ok, (result.error, (tmp_path / "run" / "stderr.txt").read_text()[-3000:])
    assert len(result.steps) == steps
    return result, result.report()


def check_parts(result, report) -> dict:
    """Every step's measured phases fit in it (no part counted twice), so the breakdown adds up."""
    for s in result.steps:
        measured = sum(getattr(s, p) for p in PARTS if p != "other_s")
        assert measured <= s.total_s * (1 + 1e-6), s
    bd = report.sections["breakdown"]
    used = usable_steps(result.steps)
    assert sum(bd[p] for p in PARTS) == pytest.approx(statistics.fmean(s.total_s for s in used), rel=1e-6)
    assert bd["forward_s"] > 0 and bd["backward_s"] > 0
    return bd


@pytest.mark.parametrize("manual", [False, True])
def test_lightning_closure_is_forward_and_backward(tmp_path, manual):
    name = "lightning_loop.py"
    result, report = profile(tmp_path, name, *(["--manual"] if manual else []))
    top = report.ranked()[0]
    assert top.id == "dataloader.workers", [(f.id, f.est_saving_s) for f in report.ranked()]
    assert top.location.endswith(f"{name}:{line_of(name, 'loader = DataLoader(')}")
    bd = check_parts(result, report)
    assert bd["boundary"] == "optimizer.step()"
    # the training step and backward run inside optimizer.step(closure): every step attributes them as
    # forward and backward, and check_parts shows no time counted twice (not also as optimizer time)
    assert all(s.forward_s > 0 and s.backward_s > 0 for s in result.steps), result.steps


def test_hf_trainer(tmp_path):
    pytest.importorskip("transformers")
    result, report = profile(tmp_path, "hf_trainer.py", "--max-steps", "40")
    top = report.ranked()[0]
    assert top.id == "dataloader.workers", [(f.id, f.est_saving_s) for f in report.ranked()]
    bd = check_parts(result, report)
    assert bd["boundary"] == "optimizer.step()"
    assert bd["optimizer_s"] < bd["forward_s"] + bd["backward_s"]
    assert result.config["models"][0]["type"] == "BertForSequenceClassification"


def test_accelerate_backward(tmp_path):
    pytest.importorskip("accelerate")
    name = "accelerate_loop.py"
    result, report = profile(tmp_path, name, steps=8)
    top = report.ranked()[0]
    assert top.id == "sync.item", [(f.id, f.est_saving_s) for f in report.ranked()]
    # three syncs a sample, as many calls each and within noise of each other in cost: the finding
    # names the costliest of them, which may be any of the loop's three lines
    loop = line_of(name, "correct.append(bool(preds[i] == yb[i]))")
    assert any(top.location.endswith(f"{name}:{n}") for n in (loop, loop + 1, loop + 2)), top.location
    bd = check_parts(result, report)
    assert bd["boundary"] == "optimizer.step()"


def test_word_language_model_without_an_optimizer(tmp_path):
    """The public-style manual-SGD LSTM: steps by backward(), torch.save(model) after each epoch,
    per-step loss.item() found."""
    name = "word_lm.py"
    saved = tmp_path / "model.pt"
    args = ["--ntoken", "500", "--emsize", "32", "--nhid", "32", "--batches-per-epoch", "4"]
    result, report = profile(tmp_path, name, *args, "--save", str(saved), steps=10)
    assert result.status == "stopped" and result.returncode == 0
    assert saved.exists()  # torch.save(model, f) ran (epochs of 4 steps) under the instrumentation
    bd = check_parts(result, report)
    assert bd["boundary"] == "backward()" and report.meta["step_boundary"] == "backward()"
    assert bd["optimizer_s"] == 0
    f = report.by_id("sync.item")
    assert f is not None
    assert f.location.endswith(f"{name}:{line_of(name, 'total_loss += loss.item()')}")
    assert result.losses and all(v is not None for v in result.losses)
