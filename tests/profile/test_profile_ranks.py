"""``pitstop profile -- torchrun ...``: two gloo ranks on localhost, with planted causes."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import jsonschema
import pytest

from pitstop.cli import main as cli_main
from pitstop.profile.record.overrides import Overrides
from pitstop.profile.runs import ranks
from pitstop.profile.runs.merge import merge_dir
from pitstop.profile.runs.runner import RunSpec, run
from pitstop.report.jsonfmt import load_schema

pytestmark = pytest.mark.slow

PLANTED = Path(__file__).with_name("planted_ddp.py")
BACKWARD_LINE = next(i for i, ln in enumerate(PLANTED.read_text().splitlines(), 1) if "loss.backward()" in ln)
DDP_LINE = next(i for i, ln in enumerate(PLANTED.read_text().splitlines(), 1) if ln.startswith("ddp = "))
REDUCE_LINE = next(
    i for i, ln in enumerate(PLANTED.read_text().splitlines(), 1) if "dist.all_reduce(t)" in ln
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(*extra: str, nproc: int = 2, module: bool = False) -> list[str]:
    return [
        *([sys.executable, "-m", "torch.distributed.run"] if module else ["torchrun"]),
        f"--nproc_per_node={nproc}",
        "--master_addr=127.0.0.1",
        f"--master_port={free_port()}",
        *extra,
        str(PLANTED),
    ]


def profile(tmp_path: Path, steps: int = 6, module: bool = False, **env: str):
    spec = RunSpec(
        command=torchrun(module=module),
        steps=steps,
        warmup=2,
        timeout=120,
        quiet=True,
        env={"MASTER_ADDR": "127.0.0.1", **env},
        cwd=str(tmp_path),
    )
    res = run(spec, out_dir=tmp_path / "run")
    return res, res.report()


def by_id(report, fid):
    return [f for f in report.findings if f.id == fid]


def test_straggler_named_by_rank_and_phase_with_rank0_wait(tmp_path, monkeypatch):
    """The done-when case, through the CLI as a user types it."""
    out = tmp_path / "report.json"
    monkeypatch.setenv("SLOW_RANK_S", "0.04")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    html = tmp_path / "report.html"
    code = cli_main(
        [
            "profile",
            "--steps",
            "6",
            "--warmup",
            "2",
            "-q",
            "--json",
            str(out),
            "--html",
            str(html),
            "--",
            *torchrun(),
        ]
    )
    doc = json.loads(out.read_text())
    assert code == 0, doc.get("error")
    jsonschema.validate(doc, load_schema())
    page = html.read_text()
    assert "Per-rank step breakdown" in page and "Rank 1: where a step goes" in page and "Skew" in page
    ranks = doc["sections"]["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1]
    assert all(r["status"] == "stopped" and r["measured_steps"] == 6 for r in ranks)
    [strag] = [f for f in doc["findings"] if f["id"] == "distributed.straggler"]
    assert strag["data"]["rank"] == 1
    assert strag["data"]["phase"] == "data_wait_s"
    wait0 = strag["data"]["others_wait_s"]["0"]
    # rank 0's wait is what it measured in DDP's all-reduce, and rank 1 arrived last at the all-reduces
    assert wait0 == pytest.approx(
        ranks[0]["comm_per_step"]["ddp_exposed_s"] + ranks[0]["comm_per_step"]["collective_s"]
    )
    assert wait0 > ranks[1]["comm_per_step"]["ddp_exposed_s"]
    assert strag["data"]["skew"]["last_rank"].get("1", 0) > strag["data"]["skew"]["calls"] / 2
    assert "all-reduce" in strag["evidence"]
    # per-process findings are kept per rank
    assert any(f["id"].startswith("dataloader") and f["data"].get("rank") == 1 for f in doc["findings"])


def test_find_unused_parameters_measured(tmp_path):
    res, report = profile(tmp_path, FIND_UNUSED="1", SKIP_SPARE="1")
    assert res.ok, res.error
    [f] = by_id(report, "ddp.find_unused_parameters")
    assert f.data["unused_parameters"] == 2  # spare.weight, spare.bias
    assert f.data["search_s"] > 0
    assert "flag is needed" in f.evidence
    probes = {r: rr.data.get("probes") for r, rr in res.ranks.items()}
    assert probes[1] is None and probes[0] and not probes[0].get("error"), probes[0]
    assert "pass_s" in probes[0]  # rank 0's model probes ran, on its model copied out of DDP
    [note] = by_id(report, "profile.probes_ranks")
    assert "probes skipped on rank 1" in note.evidence and "copy of its model outside DDP" in note.evidence


def test_accumulation_without_no_sync_and_explicit_collectives(tmp_path):
    res, report = profile(tmp_path, module=True, ACCUM="2", EXPLICIT="1")  # python -m torch.distributed.run
    assert res.ok, res.error
    [f] = by_id(report, "ddp.no_sync")
    assert f.data["rounds_per_step"] == pytest.approx(2.0)
    sites = report.sections["ranks"][0]["collective_sites"]
    [site] = [s for s in sites if s["op"] == "all_reduce"]
    assert site["location"].endswith(f"planted_ddp.py:{REDUCE_LINE}")
    assert site["bytes"] == 4 * site["count"]  # one float32 loss per call
    assert "all_reduce" in report.sections["distributed"]["skew"]


def test_user_comm_hooks_python_timed_builtin_said_untimed(tmp_path):
    res, report = profile(tmp_path, steps=3, COMM_HOOK="fp16")
    assert res.ok, res.error
    [r0] = [r for r in report.sections["ranks"] if r["rank"] == 0]
    assert r0["ddp"][0]["hook"].endswith("fp16_compress_hook") and r0["comm_per_step"]["ddp_rounds"] == 1.0
    assert not by_id(report, "distributed.comm_untimed")
    (tmp_path / "again").mkdir()
    res, report = profile(tmp_path / "again", steps=3, COMM_HOOK="builtin")
    assert res.ok, res.error
    [f] = by_id(report, "distributed.comm_untimed")
    assert "FP16_COMPRESS" in f.evidence and f.location.endswith(f"planted_ddp.py:{DDP_LINE}")
    assert all(r["comm_per_step"]["ddp_rounds"] == 0 for r in report.sections["ranks"])


def test_oversubscribed_threads(tmp_path):
    res, report = profile(tmp_path, steps=3, OVERSUBSCRIBE="1")
    assert res.ok, res.error
    [f] = by_id(report, "distributed.threads")
    cpus = len(os.sched_getaffinity(0))
    assert f.data["threads"] == 2 * cpus and f.data["cpus"] == cpus
    assert f.data["overlap"] is True


def test_ranks_out_of_lockstep_stop_together_at_the_same_step(tmp_path):
    """No DDP: explicit collectives (one blocking every third step, one async across each step boundary)
    and a slower rank 1. Rank 0 measures its steps first and waits at the stop step until rank 1 is there."""
    cmd = [*torchrun()[:-1], str(PLANTED.with_name("planted_collectives.py"))]
    spec = RunSpec(command=cmd, steps=7, warmup=2, timeout=120, quiet=True, cwd=str(tmp_path),
                   env={"MASTER_ADDR": "127.0.0.1"})  # fmt: skip
    res = run(spec, out_dir=tmp_path / "run")
    assert res.ok and res.status == "stopped", res.error
    dists = {r: rr.data["distributed"] for r, rr in res.ranks.items()}
    assert {r: d["stopped_at"] for r, d in dists.items()} == {0: 9, 1: 9}  # warm-up + measured steps
    assert all(d["stop_note"] is None for d in dists.values())  # agreed through the store, not timed out
    assert all(len(rr.steps) == 7 for rr in res.ranks.values())
    # other processes' CPU use, the launcher and its ranks excluded, is measured for the launch
    assert 0.0 <= res.data["other_cpu_share"] <= 1.0
    assert sum(f.id.startswith("summary.") for f in res.report().findings) <= 1  # one verdict, not one a rank


def test_ranks_that_count_steps_differently_are_reported_at_the_stop(tmp_path):
    """Rank 1 waits in an all_reduce for rank 0, which has measured its steps and waits at the stop."""
    script = PLANTED.with_name("planted_mismatch.py")
    line = next(i for i, ln in enumerate(script.read_text().splitlines(), 1) if "dist.all_reduce(" in ln)
    spec = RunSpec(command=[*torchrun()[:-1], str(script)], steps=7, warmup=2, timeout=120, quiet=True,
                   cwd=str(tmp_path), env={"MASTER_ADDR": "127.0.0.1"})  # fmt: skip
    res = run(spec, out_dir=tmp_path / "run")
    assert res.status == "hung", (res.status, res.error)
    assert "rank 0 measured its steps and waits to stop after step 9" in res.error
    # the collective with its number among those the rank entered, and its bytes
    assert re.search(
        rf"rank 1 waiting in all_reduce \(collective #\d+, 4 B\) at {re.escape(str(script))}:{line}\b",
        res.error,
    )
    assert len(res.ranks[0].steps) == 7  # rank 0 keeps what it measured


def test_thread_override_reaches_every_rank(tmp_path):
    """What `pitstop fix` runs for its thread-split candidate: the override wins over the script's own."""
    spec = RunSpec(command=torchrun(), steps=3, warmup=1, timeout=120, quiet=True, cwd=str(tmp_path),
                   env={"MASTER_ADDR": "127.0.0.1", "OVERSUBSCRIBE": "1"}, overrides=Overrides(num_threads=1))  # fmt: skip
    res = run(spec, out_dir=tmp_path / "run")
    assert res.ok, res.error
    report = res.report()
    assert not by_id(report, "distributed.threads")
    cpus = len(os.sched_getaffinity(0))
    for r in report.sections["ranks"]:
        assert r["process"]["intra_op_threads"] == 1
        assert r["process"]["script_asked_threads"] == cpus


def test_rank_that_raises_at_step_5_reports_all_ranks(tmp_path):
    res, report = profile(tmp_path, steps=10, RAISE_AT="5")
    assert not res.ok
    assert res.error.startswith("rank 1: ValueError: planted failure at step 5 (at ")
    assert {r["rank"] for r in report.sections["ranks"]} == {0, 1}
    assert by_id(report, "distributed.failure")
    assert 0.0 <= res.data["other_cpu_share"] <= 1.0  # measured for a failed launch too


LATE_SIGTERM = """
import os, signal
import torch
import torch.distributed as dist
from pitstop.profile.process import bootstrap

dist.init_process_group("gloo")
# the launcher's SIGTERM (a peer has failed) arriving after the script ended, while this rank reports
bootstrap.ON_END.append(lambda: os.kill(os.getpid(), signal.SIGTERM))
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(4):
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
raise ValueError("planted failure after 4 steps")
"""


def test_stop_signal_after_the_script_failed_keeps_its_report(tmp_path):
    """A rank whose script raised is then sent SIGTERM by the launcher: its report is the script's error,
    with every distributed section, not an interruption of the report being written."""
    script = tmp_path / "late_sigterm.py"
    script.write_text(LATE_SIGTERM)
    spec = RunSpec(command=[*torchrun(nproc=1)[:-1], str(script)], steps=10, warmup=1, timeout=120,
                   quiet=True, env={"MASTER_ADDR": "127.0.0.1"}, cwd=str(tmp_path))  # fmt: skip
    res = run(spec, out_dir=tmp_path / "run")
    rank0 = res.ranks[0]
    assert rank0.status == "error"
    assert rank0.error.startswith("ValueError: planted failure after 4 steps"), rank0.error
    assert "finalize_error" not in rank0.data
    dist = rank0.data["distributed"]
    assert dist["signal"] is None
    assert dist["state"]["rank"] == 0 and "comm" in dist


def test_rank_that_exits_while_the_other_is_in_all_reduce(tmp_path):
    res, report = profile(tmp_path, steps=10, EXIT_AT="5")
    assert not res.ok
    assert res.error.startswith("rank 1: "), res.error
    r0 = next(r for r in report.sections["ranks"] if r["rank"] == 0)
    assert r0["state"]["current"]["what"] == "DDP gradient all-reduce"
    assert r0["state"]["current"]["location"].endswith(f"planted_ddp.py:{BACKWARD_LINE}")
    # rank 1 leaves in step 5 before its backward: its last collective was step 4's all-reduce
    assert res.error.startswith(
        "rank 1: ended abruptly (os._exit, a signal or a crash in native code) after reaching its collectives of step 4"
    )
    assert re.search(r"rank 0 was waiting in DDP gradient all-reduce \(collective #\d+\) at ", res.error)
    assert f"planted_ddp.py:{BACKWARD_LINE} (step 5)" in res.error


def test_timeout_says_where_each_rank_was(tmp_path, monkeypatch):
    monkeypatch.setattr(ranks, "STUCK_S", 1e6)  # not called a hang first (rank 1 never enters the all-reduce)
    spec = RunSpec(command=torchrun(), steps=50, warmup=2, timeout=45, quiet=True, cwd=str(tmp_path),
                   env={"MASTER_ADDR": "127.0.0.1", "HANG_AT": "5"})  # fmt: skip
    res = run(spec, out_dir=tmp_path / "run")
    assert res.status == "timeout"
    assert re.search(r"rank 0 waiting in DDP gradient all-reduce \(collective #\d+\) at ", res.error)
    assert f"planted_ddp.py:{BACKWARD_LINE} for " in res.error
    assert "rank 1 at step 5" in res.error
    assert {r["rank"] for r in res.report().sections["ranks"]} == {0, 1}


def test_ctrl_c_stops_every_rank(tmp_path):
    out = tmp_path / "report.json"
    run_dir = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "pitstop",
        "profile",
        "--full",
        "-q",
        "--json",
        str(out),
        "--out-dir",
        str(run_dir),
    ]
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "PYTHONPATH": str(Path(__file__).parents[2] / "src")}
    proc = subprocess.Popen(
        [*cmd, "--", *torchrun()], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    deadline = time.monotonic() + 90
    pids: list[int] = []
    while time.monotonic() < deadline:  # both ranks are past their third step
        states = [json.loads(p.read_text()) for p in run_dir.glob("rank-*/state.json") if p.stat().st_size]
        if len(states) == 2 and all(s["step"] >= 3 for s in states):
            pids = [s["pid"] for s in states]
            break
        time.sleep(0.2)
    assert pids, "ranks never started"
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 130
    doc = json.loads(out.read_text())
    assert doc["meta"]["status"] == "interrupted"
    assert {r["rank"]: r["status"] for r in doc["sections"]["ranks"]} == {0: "interrupted", 1: "interrupted"}
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_two_nodes_share_an_out_dir_and_merge(tmp_path):
    shared = tmp_path / "shared"
    port = free_port()
    results = {}

    def node(rank: int) -> None:
        cmd = ["torchrun", "--nnodes=2", f"--node_rank={rank}", "--nproc_per_node=1", "--rdzv_backend=c10d",
               f"--rdzv_endpoint=127.0.0.1:{port}", "--rdzv_id=pitstop-test", str(PLANTED)]  # fmt: skip
        spec = RunSpec(
            command=cmd, steps=4, warmup=1, timeout=120, quiet=True, env={"MASTER_ADDR": "127.0.0.1"}
        )
        results[rank] = run(spec, out_dir=shared)

    threads = [threading.Thread(target=node, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=180)
    assert all(results[r].ok for r in (0, 1)), [results[r].error for r in results]
    merged = merge_dir(shared)
    assert sorted(merged.ranks) == [0, 1]
    report = merged.report()
    assert [r["measured_steps"] for r in report.sections["ranks"]] == [4, 4]
    assert report.meta["world_size"] == 2
    code = cli_main(["profile", "-q", "--json", str(tmp_path / "m.json"), "merge", str(shared)])
    assert code == 0
    assert len(json.loads((tmp_path / "m.json").read_text())["sections"]["ranks"]) == 2


def test_accelerate_launch_single_process_is_profiled(tmp_path):
    """`accelerate launch` of one process starts the script with no RANK: the launcher's child is the rank."""
    script = tmp_path / "single.py"
    script.write_text(
        "import torch\nfrom torch import nn\ntorch.set_num_threads(1)\n"
        "m = nn.Linear(8, 2)\nopt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        "for _ in range(50):\n    loss = m(torch.randn(4, 8)).sum()\n"
        "    opt.zero_grad()\n    loss.backward()\n    opt.step()\n"
    )
    cmd = ["accelerate", "launch", "--cpu", "--num_processes", "1", "--num_machines", "1",
           "--mixed_precision", "no", "--dynamo_backend", "no", str(script)]  # fmt: skip
    res = run(RunSpec(command=cmd, steps=5, warmup=1, timeout=120, quiet=True, cwd=str(tmp_path)))
    assert res.ok, res.error
    assert res.launcher == "accelerate" and sorted(res.ranks) == [0]
    assert len(res.steps) == 5


def test_accelerate_launch_of_two_processes_profiles_both_ranks(tmp_path):
    """`accelerate launch` of 2 CPU processes (its torchrun path: ``--multi_gpu`` with the script's
    ``Accelerator(cpu=True)``; ``--cpu`` alone starts one process unless under mpirun)."""
    example = Path(__file__).resolve().parents[2] / "examples" / "accelerate_loop.py"
    cmd = ["accelerate", "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
           "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(free_port()),
           str(example), "--epochs", "3"]  # fmt: skip
    res = run(RunSpec(command=cmd, steps=5, warmup=2, timeout=180, quiet=True, cwd=str(tmp_path)))
    assert res.ok, res.error
    assert res.launcher == "accelerate" and sorted(res.ranks) == [0, 1]
    assert all(len(rr.steps) == 5 for rr in res.ranks.values())
    report = res.report()
    assert {f.data["rank"] for f in by_id(report, "sync.item")} == {0, 1}  # the example's planted problem
    for r in report.sections["ranks"]:
        assert r["world_size"] == 2 and r["ddp"] and r["comm_per_step"]["ddp_rounds"] == 1.0
    assert by_id(report, "profile.probes_ranks")


def test_fsdp_all_gather_and_reduce_scatter_measured(tmp_path):
    fsdp = pytest.importorskip("torch.distributed.fsdp")
    if not hasattr(fsdp, "fully_shard"):
        pytest.skip("FSDP2 (fully_shard) not in this torch")
    script = Path(__file__).with_name("planted_fsdp.py")
    cmd = [
        "torchrun",
        "--nproc_per_node=2",
        "--master_addr=127.0.0.1",
        f"--master_port={free_port()}",
        str(script),
    ]
    res = run(RunSpec(command=cmd, steps=4, warmup=1, timeout=120, quiet=True, cwd=str(tmp_path)))
    assert res.ok, res.error
    report = res.report()
    for r in report.sections["ranks"]:
        ops = {s["op"]: s for s in r["collective_sites"]}
        gathers = [s for s in r["collective_sites"] if "all_gather" in s["op"]]
        scatters = [s for s in r["collective_sites"] if "reduce_scatter" in s["op"]]
        assert gathers and scatters, ops
        assert all(s["bytes"] > 0 and s["location"].startswith(str(script)) for s in gathers + scatters)
        assert r["comm_per_step"]["collective_s"] > 0  # FSDP waits on its async Works
