"""fix --apply for the distributed fixes: static_graph on the DDP call, the thread split and no_sync_every
first in main, on a copy of examples/ddp_accum.py; the verification reads a launch's slowest rank."""

from __future__ import annotations

import ast
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from torch import nn

from pitstop.fix.apply import apply_all, plan
from pitstop.fix.apply_verify import verify
from pitstop.fix.core import FixConfig, FixResult
from pitstop.fix.judge import Measured
from pitstop.measure import Interval
from pitstop.profile.record.timeline import StepRecord
from pitstop.profile.runs.ranks import RanksResult
from pitstop.profile.runs.runner import RunResult

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "ddp_accum.py"
KINDS = [
    ("static_graph", {"ddp_static_graph": True}, "find_unused_parameters=True, static_graph=True)"),
    ("threads", {"num_threads": 1}, "    torch.set_num_threads(1)"),
    ("no_sync", {"ddp_no_sync": 4}, "    no_sync_every(4)"),
]


@pytest.fixture
def script(tmp_path: Path) -> Path:
    p = tmp_path / "train.py"
    shutil.copy(EXAMPLE, p)
    return p


def result_for(script: Path, *fixes: tuple[str, dict]) -> FixResult:
    text = script.read_text()
    at = next(i + 1 for i, ln in enumerate(text.splitlines()) if "model = DDP(" in ln)
    r = FixResult(
        command=["torchrun", "--nproc_per_node=2", str(script)], baseline=Measured("b", "baseline", {})
    )
    r.config = {"distributed": {"ddp": [{"location": f"{script}:{at}"}]}, "device": "cpu"}
    for kind, ov in fixes:
        r.candidates.append(Measured(kind, kind, ov))
        r.chosen.append(kind)
    return r


@pytest.mark.parametrize(("kind", "ov", "marker"), KINDS, ids=[k[0] for k in KINDS])
def test_each_distributed_fix_is_placed_and_the_rest_of_the_file_is_kept(script, kind, ov, marker):
    p = plan(result_for(script, (kind, ov)))
    assert not p.unplaced, p.unplaced
    (patch,) = p.patches
    ast.parse(patch.patched)
    assert marker in patch.patched and marker not in patch.original
    added = [ln for ln in patch.diff.splitlines() if ln.startswith("+") and not ln.startswith("+++")]
    removed = [ln for ln in patch.diff.splitlines() if ln.startswith("-") and not ln.startswith("---")]
    assert len(removed) == (1 if kind == "static_graph" else 0)  # only the DDP line is rewritten
    assert len(added) == {"static_graph": 1, "threads": 1, "no_sync": 2}[kind]
    if kind == "no_sync":
        assert "from pitstop.train import no_sync_every" in patch.patched


def test_a_launch_commands_script_fix_goes_into_the_workers_script_never_the_launcher(script):
    for command in (
        ["torchrun", "--nproc_per_node", "2", "--master_port=0", str(script), "--steps", "3"],
        [sys.executable, "-m", "torch.distributed.run", "--standalone", str(script)],
    ):
        r = result_for(script, ("host_memory", {"keep_host_memory": True}))
        r.command = command
        (patch,) = plan(r).patches
        assert patch.path == script and "keep_host_memory()" in patch.patched
    r.command = ["torchrun", "--no-python", "echo", "hi"]
    out = plan(r)
    assert not out.patches and "runs a module, not a script file" in out.unplaced[0]


def test_static_graph_without_a_ddp_call_at_the_line_is_unplaced(script):
    r = result_for(script, ("static_graph", {"ddp_static_graph": True}))
    r.config["distributed"]["ddp"][0]["location"] = f"{script}:1"
    out = plan(r)
    assert not out.patches and "static_graph" in out.unplaced[0]


def test_verify_of_a_launch_reads_its_slowest_rank(script):
    r = result_for(script, ("threads", {"num_threads": 1}))
    apply_all(plan(r).patches)
    r.baseline.arm.rounds = [[0.12] * 10] * 3
    r.interval = Interval(1.2, 1.1, 1.3, 3, 30, 30)

    def steps(t):
        return [StepRecord(index=i, start_s=0.0, total_s=t) for i in range(8)]

    def runner(spec):
        ranks = {
            0: RunResult(0, None, steps(0.08), [1.0] * 8, {}, None, 1.0, status="stopped"),
            1: RunResult(0, None, steps(0.1), [1.0] * 8, {}, None, 1.0, status="stopped"),
        }
        return RanksResult(0, None, [], [], {}, None, 1.0, status="stopped", ranks=ranks)

    v = verify(r, FixConfig(), runner)
    assert v.speedup == pytest.approx(1.2) and v.inside is True  # rank 1's 0.1 s, not rank 0's


def test_no_sync_every_installs_the_measured_mechanism_and_undoes_it():
    from pitstop.train import no_sync_every

    before = nn.parallel.DistributedDataParallel.forward
    inj = no_sync_every(3)
    try:
        assert inj.every == 3 and nn.parallel.DistributedDataParallel.forward is not before
    finally:
        inj.uninstall()
    assert nn.parallel.DistributedDataParallel.forward is before


@pytest.mark.slow
def test_the_patched_ddp_example_trains_to_the_same_loss(script):
    """All three fixes applied: the 2-rank gloo job still runs, and its loss is the original's (no_sync
    all-reduces the same summed gradients once per step)."""

    def loss_of(path: Path) -> float:
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1",
               f"--master_port={port}"]  # fmt: skip
        out = subprocess.run(
            [*cmd, str(path), "--steps", "6", "--width", "64"],
            capture_output=True, text=True, timeout=180, env=env, cwd=path.parent,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr[-2000:]
        return float(re.search(r"loss ([0-9.]+)", out.stdout).group(1))

    original = loss_of(EXAMPLE)
    p = plan(result_for(script, *((k, ov) for k, ov, _ in KINDS)))
    assert not p.unplaced and len(p.patches) == 1
    apply_all(p.patches)
    assert loss_of(script) == pytest.approx(original, rel=1e-3)
