"""`tune batch-size` has a time budget on every device and keeps what it measured when the budget or
Ctrl-C ends the search. Time is a fake clock that each batch advances by the batch's size, so no test
depends on how fast this machine is."""

from __future__ import annotations

import json

import pytest
import torch

from pitstop.cli import main
from pitstop.tune.batch_size import batch_size_findings, find_batch_size

torch.set_num_threads(1)


class Clock:
    """Seconds that pass only when a batch is made: 0.01 s per sample."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def batches(self, interrupt_at: int | None = None):
        def make(bs: int):
            if bs == interrupt_at:
                raise KeyboardInterrupt
            self.now += 0.01 * bs
            return torch.randn(bs, 4), torch.randn(bs, 1)

        return make


def test_the_time_budget_ends_the_search_and_keeps_the_sizes_measured():
    clock, seen = Clock(), []
    r = find_batch_size(
        torch.nn.Linear(4, 1),
        clock.batches(),
        budget_bytes=2**30,
        start=2,
        time_budget_s=1.0,  # sizes 2..32 take 0.02+0.04+...+0.32 = 0.62 s; 64 would end at 1.26 s
        on_trial=lambda res: seen.append(len(res.trials)),
        clock=clock,
    )
    assert [t.batch_size for t in r.trials] == [2, 4, 8, 16, 32]
    assert all(t.fits and t.samples_per_s for t in r.trials)
    assert r.out_of_time == 64 and r.best == 32 and not r.interrupted
    assert seen == [1, 2, 3, 4, 5]  # the caller got the result after every size
    (best,) = [f for f in batch_size_findings(r) if f.id == "tune.batch_size.best"]
    assert best.title == "Largest batch size measured to fit: 32"
    assert "1 s time budget before batch size 64" in best.evidence and "--time-budget" in best.fix


def test_no_budget_searches_to_the_maximum():
    clock = Clock()
    r = find_batch_size(
        torch.nn.Linear(4, 1),
        clock.batches(),
        budget_bytes=2**30,
        max_batch_size=64,
        time_budget_s=None,
        clock=clock,
    )
    assert r.best == 64 and r.out_of_time is None


def test_ctrl_c_keeps_the_sizes_measured():
    clock = Clock()
    model = torch.nn.Linear(4, 1)
    before = [p.detach().clone() for p in model.parameters()]
    r = find_batch_size(model, clock.batches(interrupt_at=16), budget_bytes=2**30, clock=clock)
    assert r.interrupted and r.best == 8 and [t.batch_size for t in r.trials] == [2, 4, 8]
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    (best,) = [f for f in batch_size_findings(r) if f.id == "tune.batch_size.best"]
    assert "measured to fit: 8" in best.title and "interrupted" in best.evidence


def test_the_cli_shows_the_budget_up_front_and_reports_what_it_measured(tmp_path, capsys):
    factories = tmp_path / "facts.py"
    factories.write_text(
        "import torch\nfrom torch.utils.data import TensorDataset\n"
        "def model():\n    return torch.nn.Linear(4, 1)\n"
        "def data():\n    return TensorDataset(torch.randn(64, 4), torch.randn(64, 1))\n"
    )
    out = tmp_path / "bs.json"
    argv = ["tune", "batch-size", "--model", f"{factories}:model", "--dataset", f"{factories}:data"]
    code = main([*argv, "--budget-mib", "512", "--time-budget", "0.001", "--json", str(out)])
    assert code == 0
    assert "at most 0.001 s (--time-budget)" in capsys.readouterr().err
    doc = json.loads(out.read_text())
    trials = doc["sections"]["batch_size"]["trials"]
    assert [t["batch_size"] for t in trials] == [2]  # the first size always runs; the next cannot fit in time
    assert doc["sections"]["batch_size"]["out_of_time"] == 4 and doc["meta"]["time_budget_s"] == 0.001


SCRIPT = """
import time
import pytest
import torch
from torch.utils.data import DataLoader, Dataset


class Slow(Dataset):
    def __len__(self):
        return 4096

    def __getitem__(self, i):
        time.sleep(0.001)  # a size of 1024 takes a second to build: Ctrl-C finds the search mid-way
        return torch.randn(4), torch.randn(1)


model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for x, y in DataLoader(Slow(), batch_size=4):
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
    opt.zero_grad()
"""


@pytest.mark.slow
def test_ctrl_c_in_script_mode_exits_130_with_the_sizes_measured(tmp_path):
    import os
    import signal
    import subprocess
    import sys

    script, out = tmp_path / "train.py", tmp_path / "bs.json"
    script.write_text(SCRIPT)
    cmd = [sys.executable, "-m", "pitstop", "tune", "batch-size", "-q", "--json", str(out)]
    proc = subprocess.Popen(
        [*cmd, "--", sys.executable, str(script)], stderr=subprocess.PIPE, text=True, env=dict(os.environ)
    )
    for line in proc.stderr:  # the tuner in the script's process says each size as it starts it
        if "batch size 64" in line:
            break
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 130
    doc = json.loads(out.read_text())
    sizes = [t["batch_size"] for t in doc["sections"]["batch_size"]["trials"]]
    assert sizes[:5] == [2, 4, 8, 16, 32]
    assert doc["meta"]["interrupted"] and "interrupted" in doc["error"]
