"""DDP and FSDP2 on gloo with 2 processes via torchrun match one process at the same global batch."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

WORKER = Path(__file__).with_name("ddp_worker.py")
pytestmark = pytest.mark.slow


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


@pytest.fixture(scope="module")
def single(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("single")
    _run([sys.executable, str(WORKER), "--out", str(out), "--batch-size", "32"])
    ref = torch.load(out / "rank0.pt", weights_only=True)
    assert ref["applied"]["distributed"] == "none" and ref["steps"] == 9
    torch.manual_seed(1)
    init = torch.nn.Sequential(torch.nn.Linear(10, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    assert any(not torch.allclose(p, q) for p, q in zip(init.parameters(), ref["params"], strict=True))
    return ref


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_two_gloo_processes_match_single_process(single: dict, strategy: str, tmp_path: Path) -> None:
    # Per rank: micro-batches of 8 with 2-step accumulation (no_sync / FSDP2 gradient-sync off on the
    # first); 2 ranks x 8 x 2 = the single process's batch of 32.
    _run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
         "--master-port", str(_free_port()), str(WORKER), "--out", str(tmp_path), "--batch-size", "8",
         "--accum", "2", "--strategy", strategy]
    )  # fmt: skip
    r0 = torch.load(tmp_path / "rank0.pt", weights_only=True)
    r1 = torch.load(tmp_path / "rank1.pt", weights_only=True)
    assert r0["applied"]["distributed"] == strategy and r0["applied"]["world_size"] == 2
    assert r0["steps"] == r1["steps"] == 9
    for a, b in zip(r0["params"], r1["params"], strict=True):
        assert torch.equal(a, b)  # replicas (or gathered shards) agree
    for a, b in zip(single["params"], r0["params"], strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
    # Rank 0 wrote one checkpoint of full tensors; every rank loaded it back into a fresh model exactly.
    assert r0["ckpt_ok"] and r1["ckpt_ok"]
    saved = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    assert all(type(v) is torch.Tensor for v in saved["model"].values())


def test_a_group_joined_by_init_distributed_is_destroyed_at_exit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Scripts rarely destroy the process group; a gloo group left alive at exit can abort the process."""
    import torch.distributed as dist

    from pitstop.train import distributed

    state = {"initialized": False, "destroyed": 0}
    registered: list = []
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setattr(dist, "is_initialized", lambda: state["initialized"])
    monkeypatch.setattr(dist, "init_process_group", lambda **kw: state.update(initialized=True))
    monkeypatch.setattr(dist, "destroy_process_group", lambda: state.update(initialized=False, destroyed=1))
    monkeypatch.setattr(dist, "get_rank", lambda: 1)
    monkeypatch.setattr(dist, "get_world_size", lambda: 2)
    monkeypatch.setattr(distributed.atexit, "register", registered.append)
    env = distributed.init_distributed("cpu")
    assert env.rank == 1 and env.world_size == 2 and registered == [distributed.cleanup]
    distributed.init_distributed("cpu")  # joined already: nothing more to register
    assert registered == [distributed.cleanup]
    registered[0]()  # what the interpreter runs at exit
    assert state == {"initialized": False, "destroyed": 1}
