"""Kill a real training process with SIGKILL (after a step, and in the middle of a checkpoint save),
resume it, and check the loss trajectory and final weights equal an uninterrupted run exactly."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pitstop.train.checkpoint_io import load_checkpoint

WORKER = Path(__file__).with_name("resume_worker.py")
pytestmark = pytest.mark.slow


def _env() -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env.pop("PITSTOP_TEST_CKPT_PAUSE_FIFO", None)
    return env


def run_worker(tmp: Path, name: str, *extra: str) -> dict:
    out = subprocess.run(
        [
            sys.executable,
            str(WORKER),
            "--ckpt",
            str(tmp / f"{name}.pt"),
            "--log",
            str(tmp / f"{name}.jsonl"),
            *extra,
        ],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_until_paused(tmp: Path, name: str, *extra: str) -> str:
    """Start the worker, read its stdout until it says it paused, then SIGKILL it. Returns that line."""
    proc = subprocess.Popen(
        [
            sys.executable,
            str(WORKER),
            "--ckpt",
            str(tmp / f"{name}.pt"),
            "--log",
            str(tmp / f"{name}.jsonl"),
            *extra,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    try:
        line = proc.stdout.readline()  # blocks until the child pauses; EOF if it died first
        assert line, proc.stderr.read()
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
        assert proc.returncode == -signal.SIGKILL
        return line.strip()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def losses(path: Path) -> dict[int, list[float]]:
    out: dict[int, list[float]] = {}
    for line in path.read_text().splitlines():
        row = json.loads(line)
        out.setdefault(row["step"], []).append(row["loss"])
    return out


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, dict[int, list[float]]]:
    tmp = tmp_path_factory.mktemp("ref")
    final = run_worker(tmp, "ref")
    return final, losses(tmp / "ref.jsonl")


def _check_matches(
    reference: tuple[dict, dict[int, list[float]]], final: dict, got: dict[int, list[float]]
) -> None:
    ref_final, ref_losses = reference
    assert ref_final["done"] == 12 and len(ref_losses) == 12
    assert final["done"] == 12
    assert sorted(got) == sorted(ref_losses)
    for step, values in got.items():
        # Steps trained twice (before the kill and again after resuming) must agree with the reference too.
        assert all(v == ref_losses[step][0] for v in values), (step, values, ref_losses[step])
    assert final["param_sum"] == ref_final["param_sum"]


def test_sigkill_after_step_resumes_exactly(tmp_path: Path, reference: tuple) -> None:
    # Killed after step 5's loss is logged but before its checkpoint: the checkpoint is step 4, in the
    # second epoch (2 of 6 micro-batches consumed), so resuming replays that epoch's shuffle and skips.
    assert run_until_paused(tmp_path, "run", "--pause-after-step", "5") == "paused-after-step 5"
    model = torch.nn.Sequential(
        torch.nn.Conv2d(1, 4, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.Dropout(),
        torch.nn.Flatten(),
        torch.nn.Linear(256, 4),
    )
    state = load_checkpoint(tmp_path / "run.pt", model)
    assert (state.step, state.epoch, state.batches_in_epoch) == (4, 1, 2)
    final = run_worker(tmp_path, "run")
    assert final["resumed_from"] == 4
    _check_matches(reference, final, losses(tmp_path / "run.jsonl"))


def test_sigkill_during_save_keeps_previous_checkpoint(tmp_path: Path, reference: tuple) -> None:
    # Step 7's save is stopped half-way through writing the temp file; the kill lands there.
    assert run_until_paused(tmp_path, "run", "--pause-in-save-at-step", "7") == "mid-save"
    tmp_file = tmp_path / "run.pt.tmp"
    assert tmp_file.exists() and tmp_file.stat().st_size > 0  # the torn write is there ...
    with pytest.raises(Exception):  # noqa: B017 - any unpickling/zip error: the file is torn
        torch.load(tmp_file, weights_only=True)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(1, 4, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.Dropout(),
        torch.nn.Flatten(),
        torch.nn.Linear(256, 4),
    )
    state = load_checkpoint(tmp_path / "run.pt", model)  # ... and the previous checkpoint is intact
    assert (state.step, state.epoch, state.batches_in_epoch) == (6, 2, 0)
    final = run_worker(tmp_path, "run")
    assert final["resumed_from"] == 6
    _check_matches(reference, final, losses(tmp_path / "run.jsonl"))
