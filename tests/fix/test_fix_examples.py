"""pitstop fix for real: short runs of unmodified scripts (the built-in planted examples, and a script
whose loader waits on I/O so the planted problem's effect does not depend on how busy the cores are)."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import pytest

from pitstop.fix import FixConfig, fix_report, run_fix
from pitstop.host.cpu import cpu_has_fast_bf16, usable_cores
from pitstop.host.load import OtherCpu

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

IO_BOUND = textwrap.dedent(
    """
    import time
    import torch
    from torch.utils.data import DataLoader, Dataset

    class Shards(Dataset):  # each item waits on "storage" for 20 ms
        def __len__(self):
            return 10000

        def __getitem__(self, i):
            time.sleep(0.02)
            return torch.randn(16), i % 2

    torch.manual_seed(0)
    loader = DataLoader(Shards(), batch_size=4, shuffle=True, num_workers=0)
    model = torch.nn.Linear(16, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    """
)


@pytest.mark.slow
def test_fix_proves_more_workers_on_an_io_bound_loader_and_writes_the_diff(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(IO_BOUND)
    cfg = FixConfig(
        steps=12,
        warmup=8,  # past the 4 x 2 batches the workers prefetch, which make the first steps instant
        min_rounds=3,
        max_rounds=6,
        candidates=("workers",),
        workers_values=(4,),
        cwd=str(tmp_path),
    )
    r = run_fix([sys.executable, "train.py"], cfg)
    (workers,) = r.candidates
    assert workers.verdict == "helped", (workers.reason, workers.steps_per_s, r.baseline.steps_per_s)
    assert workers.speedup > 1.5  # four workers waiting in parallel instead of one
    assert r.chosen == ["num_workers=4"] and r.speedup == workers.speedup
    assert r.patch is not None
    assert (
        "+loader = DataLoader(Shards(), batch_size=4, shuffle=True, num_workers=4, persistent_workers=True)"
        in (r.patch.diff)
    )
    report, _ = fix_report(r)
    assert report.by_id("fix.combined").fix_code == r.patch.diff


@pytest.mark.slow
@pytest.mark.skipif(
    os.getloadavg()[0] > usable_cores(),
    reason="the planted loader problem is CPU-bound: more workers only help when cores are free",
)
def test_fix_measures_a_speedup_for_the_planted_loader_problem():
    cmd = [
        sys.executable,
        str(EXAMPLES / "slow_loader.py"),
        "--batch-size",
        "4",
        "--images",
        "32",
        "--steps",
        "1000",
    ]
    cfg = FixConfig(
        steps=8,
        warmup=2,
        min_rounds=3,
        max_rounds=3,
        candidates=("workers",),
        workers_values=(2,),
        timeout=300,
    )
    other = OtherCpu()
    r = run_fix(cmd, cfg)
    busy = other.share()
    assert r.baseline.median and len(r.baseline.steps_per_s) == 3
    (workers,) = r.candidates
    assert workers.overrides["dataloader"] == {"num_workers": 2, "persistent_workers": True}
    assert len(workers.steps_per_s) == 3 and workers.speedup is not None
    if workers.speedup <= 1.0 and busy > 0.25:  # the workers' cores were taken while it ran
        pytest.skip(f"other processes used {busy:.0%} of the CPUs during the fix run")
    assert workers.speedup > 1.0, (workers.steps_per_s, r.baseline.steps_per_s, busy)
    report, _ = fix_report(r)
    f = report.by_id("fix.workers")
    assert f.location and "slow_loader.py:" in f.location
    if workers.verdict == "helped":  # the diff targets the example's own DataLoader(...) line
        assert r.patch is not None and "num_workers=2" in r.patch.diff


@pytest.mark.slow
def test_fix_rejects_channels_last_on_an_mlp():
    cmd = [sys.executable, str(EXAMPLES / "healthy.py"), "--batch-size", "32", "--steps", "1000"]
    cfg = FixConfig(steps=6, warmup=2, min_rounds=3, max_rounds=3, candidates=("channels_last",), timeout=300)
    r = run_fix(cmd, cfg)
    (cl,) = r.candidates
    assert cl.verdict == "rejected"
    assert "nothing to change" in cl.reason
    assert len(cl.steps_per_s) == 3  # measured all the same, numbers in the report
    assert r.chosen == []
    report, _ = fix_report(r)
    assert report.by_id("fix.none") is not None


@pytest.mark.slow
@pytest.mark.skipif(not cpu_has_fast_bf16(), reason="the planted fp32 problem needs fast bf16 hardware")
def test_fix_measures_a_speedup_for_the_planted_precision_problem():
    cmd = [
        sys.executable,
        str(EXAMPLES / "conv_fp32.py"),
        "--batch-size",
        "16",
        "--size",
        "32",
        "--steps",
        "100000",
    ]
    r = run_fix(
        cmd, FixConfig(steps=6, warmup=2, min_rounds=3, max_rounds=3, candidates=("amp",), timeout=300)
    )
    (amp,) = r.candidates
    assert amp.overrides["autocast"] == "bfloat16"
    assert amp.speedup is not None and amp.speedup > 1.0, (amp.steps_per_s, r.baseline.steps_per_s)
    assert amp.verdict in ("helped", "undecided"), amp.reason  # finite loss close to fp32's
    report, _ = fix_report(r)
    f = report.by_id("fix.amp")
    assert "torch.autocast" in (f.fix_code or "") and "conv_fp32.py:" in f.location
