"""A job across nodes: two torchrun agents on localhost as node 0 and node 1 of one job (static rendezvous on
127.0.0.1), each under its own ``pitstop profile`` with its own run folder, gloo on the CPU."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

PLANTED = Path(__file__).with_name("planted_ddp.py")
SRUN_SCRIPT = Path(__file__).with_name("planted_srun.py")

SLEEP_LINE = next(i for i, ln in enumerate(PLANTED.read_text().splitlines(), 1) if "time.sleep(600)" in ln)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def two_nodes(
    tmp_path: Path, *pitstop_args: str, srun: bool = False, **env: str
) -> list[tuple[int, dict, str]]:
    """Both nodes' ``pitstop profile`` at once; (exit status, JSON report, stderr) of each. ``srun``: each
    node is a task of a Slurm job step (its variables as srun sets them) running the script itself."""
    port = free_port()
    procs = []
    for node in (0, 1):
        if srun:
            job = ["python", str(SRUN_SCRIPT)]
            env_node = {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_PROCID": str(node), "SLURM_NTASKS": "2",
                        "SLURM_LOCALID": "0", "SLURM_NODEID": str(node), "MASTER_ADDR": "127.0.0.1",
                        "MASTER_PORT": str(port)}  # fmt: skip
        else:
            job = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", f"--node_rank={node}",
                   "--nproc_per_node=1", "--master_addr=127.0.0.1", f"--master_port={port}", str(PLANTED)]  # fmt: skip
            env_node = {}
        cmd = [sys.executable, "-m", "pitstop", "profile", "--warmup", "2", "--quiet", *pitstop_args,
               "--json", str(tmp_path / f"node{node}.json"), "--out-dir", str(tmp_path / f"run{node}"), "--", *job]  # fmt: skip
        child_env = {**os.environ, **env, **env_node}
        procs.append(
            subprocess.Popen(
                cmd, cwd=tmp_path, env=child_env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
            )
        )
    out = []
    for node, p in enumerate(procs):
        _, err = p.communicate(timeout=300)
        report = json.loads((tmp_path / f"node{node}.json").read_text())
        out.append((p.returncode, report, err))
    return out


def ranks_of(report: dict) -> dict[int, dict]:
    return {r["rank"]: r for r in report["sections"]["ranks"]}


@pytest.mark.parametrize("srun", [False, True], ids=["torchrun", "srun"])
def test_each_node_stops_cleanly_and_reports_every_rank_of_the_job(tmp_path, srun):
    """Both nodes stop together at the measured window (no rank waits for a peer pitstop stopped), and each
    node's report is the job's: both ranks, by global rank and node, the straggler on node 1 named."""
    results = two_nodes(tmp_path, "--steps", "8", srun=srun, SLOW_RANK_S="0.04")
    for code, report, err in results:
        assert code == 0, err[-2000:]
        ranks = ranks_of(report)
        assert sorted(ranks) == [0, 1]
        assert all(r["status"] == "stopped" and r["measured_steps"] == 8 for r in ranks.values())
        assert [ranks[0]["node_rank"], ranks[1]["node_rank"]] == [0, 1]
        straggler = [f for f in report["findings"] if f["id"] == "distributed.straggler"]
        assert straggler and "rank 1" in straggler[0]["evidence"]


def test_a_job_run_to_its_own_end_is_unchanged_on_every_node(tmp_path):
    results = two_nodes(tmp_path, "--full", ITEMS="240")  # 30 iterations of 8 samples
    for code, report, err in results:
        assert code == 0, err[-2000:]
        ranks = ranks_of(report)
        assert sorted(ranks) == [0, 1]
        assert all(r["status"] == "completed" for r in ranks.values())
        assert all(r["measured_steps"] == 28 for r in ranks.values())  # 30 iterations, 2 of them warm-up


def test_a_rank_asleep_on_another_node_is_named_with_its_line_and_the_collective(tmp_path):
    results = two_nodes(tmp_path, "--steps", "30", HANG_AT="4")
    for code, report, _ in results:
        assert code != 0
        error = report["error"] or ""
        assert "rank 1" in error and f"planted_ddp.py:{SLEEP_LINE}" in error, error
        assert "never entered rank 0's collective #" in error, error
        assert "rank 0" in error and "waiting in DDP gradient all-reduce" in error, error


def test_a_rank_that_dies_is_reported_by_both_nodes(tmp_path):
    (code0, report0, _), (code1, report1, _) = two_nodes(tmp_path, "--steps", "30", EXIT_AT="4")
    assert code0 != 0 and code1 != 0
    # node 1 saw its own rank end abruptly; node 0 never got its record and says so, naming rank 1 first
    assert "rank 1: ended abruptly" in report1["error"]
    assert report0["error"].startswith("rank 1: no final record came from rank 1")
    assert ranks_of(report0)[0]["status"] == "error"  # rank 0 lost its peer in the all-reduce
