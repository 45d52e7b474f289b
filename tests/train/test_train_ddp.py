"""DDP on gloo with 2 processes via torchrun matches one process at the same global batch."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

WORKER = Path(__file__).with_name("ddp_worker.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(cmd: list[str]) -> None:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.slow
def test_ddp_two_gloo_processes_match_single_process(tmp_path: Path) -> None:
    single, ddp = tmp_path / "single", tmp_path / "ddp"
    single.mkdir()
    ddp.mkdir()
    _run([sys.executable, str(WORKER), "--out", str(single), "--batch-size", "32"])
    _run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            "2",
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            str(_free_port()),
            str(WORKER),
            "--out",
            str(ddp),
            "--batch-size",
            "8",
            "--accum",
            "2",
        ]
    )
    ref = torch.load(single / "rank0.pt", weights_only=True)
    r0 = torch.load(ddp / "rank0.pt", weights_only=True)
    r1 = torch.load(ddp / "rank1.pt", weights_only=True)
    assert ref["applied"]["distributed"] == "none"
    assert r0["applied"]["distributed"] == "ddp" and r0["applied"]["world_size"] == 2
    assert ref["steps"] == r0["steps"] == r1["steps"] == 9
    for a, b in zip(r0["params"], r1["params"], strict=True):
        assert torch.equal(a, b)  # DDP keeps replicas identical
    for a, b in zip(ref["params"], r0["params"], strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
    torch.manual_seed(1)
    init = torch.nn.Sequential(torch.nn.Linear(10, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    moved = any(not torch.allclose(p, q) for p, q in zip(init.parameters(), ref["params"], strict=True))
    assert moved  # training actually changed the weights
    assert (ddp / "ckpt.pt").exists()  # rank 0 wrote the checkpoint
