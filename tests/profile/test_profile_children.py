"""``pitstop profile -- python script.py`` where the script trains in torch.multiprocessing children
(Hogwild ``mp.Process``, ``mp.spawn`` without torchrun): each child is measured like a torchrun rank."""

from __future__ import annotations

import json
import multiprocessing
import os
import pickle
import signal
import subprocess
import sys
import time
from multiprocessing.process import BaseProcess
from pathlib import Path

import jsonschema
import pytest

from pitstop.cli import main as cli_main
from pitstop.profile.process.children import Followed, Follower, _user_target
from pitstop.profile.runs.runner import RunSpec, run
from pitstop.report.jsonfmt import load_schema

HERE = Path(__file__).resolve().parent
PLANTED = HERE / "planted_children.py"
EXAMPLES = HERE.parents[1] / "examples"
CRASH_LINE = next(
    i for i, ln in enumerate(PLANTED.read_text().splitlines(), 1) if "raise RuntimeError(" in ln
)


def profile(tmp_path: Path, script: Path = PLANTED, *args: str, steps: int = 4, **env: str):
    spec = RunSpec(command=[sys.executable, str(script), *args], steps=steps, warmup=1, timeout=240,
                   quiet=True, probes=False, env={"OMP_NUM_THREADS": "1", **env}, cwd=str(tmp_path))  # fmt: skip
    res = run(spec, out_dir=tmp_path / "run")
    return res, res.report()


def ids(report) -> list[str]:
    return [f.id for f in report.findings]


def test_library_processes_are_not_followed():
    from multiprocessing.pool import worker

    from torch.utils.data._utils.worker import _worker_loop

    assert _user_target(lambda: None)
    assert not _user_target(None) and not _user_target(worker) and not _user_target(_worker_loop)


def _train(rank: int) -> None:
    pass


def test_start_carries_the_target_in_a_picklable_wrapper_only_while_starting():
    follower = Follower(inst=None, cfg={"steps": 3})
    seen = []

    def start(proc):  # what BaseProcess.start does: the child gets the target, then the object drops it
        seen.append(pickle.loads(pickle.dumps(proc._target)))  # spawn and forkserver pickle the process
        del proc._target, proc._args

    proc = multiprocessing.Process(target=_train, args=(0,))
    follower.start(start, proc)
    [carried] = seen
    assert isinstance(carried, Followed) and carried.target is _train and carried.cfg == {"steps": 3}
    assert not hasattr(proc, "_target") and not hasattr(proc, "_args")  # as without pitstop

    def fails(proc):
        raise OSError("cannot start")

    proc = multiprocessing.Process(target=_train, args=(0,))
    with pytest.raises(OSError):
        follower.start(fails, proc)
    assert proc._target is _train and proc._args == (0,)


@pytest.mark.slow
def test_hogwild_example_children_measured_like_ranks(tmp_path):
    """The done-when case as a user types it: the parent's test pass is not a missing step."""
    out = tmp_path / "report.json"
    code = cli_main(["profile", "--steps", "4", "--warmup", "1", "--no-probes", "-q", "--json", str(out),
                     "--", sys.executable, str(EXAMPLES / "hogwild.py"), "--samples", "512"])  # fmt: skip
    doc = json.loads(out.read_text())
    assert code == 0, doc.get("error")
    jsonschema.validate(doc, load_schema())
    assert doc["meta"]["launcher"] == "torch.multiprocessing" and doc["meta"]["children"] == 2
    assert doc["meta"]["start_methods"] == ["fork"]
    ranks = doc["sections"]["ranks"]
    assert [(r["rank"], r["status"], r["measured_steps"]) for r in ranks] == [
        (0, "stopped", 4),
        (1, "stopped", 4),
    ]
    found = {f["id"]: f for f in doc["findings"]}
    assert "profile.no_step" not in found
    note = found["profile.children"]
    assert note["title"].startswith("Training ran in 2 child processes (torch.multiprocessing, fork start)")
    assert "rank 1 (Process-2): 4 measured steps" in note["evidence"] and "Hogwild" in note["evidence"]
    assert note["data"]["parent"]["forwards"] >= 1 and note["data"]["parent"]["optimizer_steps"] == 0
    assert doc["sections"]["parent"]["status"] == "completed"


@pytest.mark.slow
def test_mp_spawn_ddp_example_children_are_ranks(tmp_path):
    res, report = profile(tmp_path, EXAMPLES / "spawn_ddp.py", "--samples", "1024")
    assert res.ok, res.error
    assert report.meta["start_methods"] == ["spawn"]
    assert sorted(res.ranks) == [0, 1] and all(len(r.steps) == 4 for r in res.ranks.values())
    for r in report.sections[
        "ranks"
    ]:  # DDP's all-reduce measured in each child, every child stopped together
        assert r["comm_per_step"]["ddp_rounds"] == 1.0 and r["ddp"][0]["location"].endswith("spawn_ddp.py:32")
        assert r["state"]["stopping"] == 5
    [note] = [f for f in report.findings if f.id == "profile.children"]
    assert "one process group" in note.evidence and "profile.no_step" not in ids(report)


@pytest.mark.slow
@pytest.mark.parametrize("start", ["spawn", "forkserver"])
def test_spawn_and_forkserver_children_are_followed(tmp_path, start):
    res, report = profile(tmp_path, START=start)
    assert res.ok, res.error
    assert report.meta["start_methods"] == [start]
    assert {r: len(x.steps) for r, x in res.ranks.items()} == {0: 4, 1: 4}
    assert res.parent is not None and res.parent.status == "completed"
    assert BaseProcess.start.__module__ == "multiprocessing.process"


@pytest.mark.slow
@pytest.mark.parametrize("launch", ["process", "spawn"])
def test_children_compute_the_same_and_probes_leave_shared_parameters_alone(tmp_path, launch):
    """--full: every child trains to the end; the exit probes (child 0, a model shared with the parent)
    run on a copy, so the parent reads the same trained model as without pitstop."""
    env = {"RESULTS": "", "SHARED": "1", "CHILDREN": "1", "LAUNCH": launch}
    plain, profiled = tmp_path / "plain", tmp_path / "profiled"
    for d in (plain, profiled):
        d.mkdir()
    subprocess.run([sys.executable, str(PLANTED)], env={**os.environ, **env, "RESULTS": str(plain)}, check=True,
                   capture_output=True, timeout=120)  # fmt: skip
    spec = RunSpec(command=[sys.executable, str(PLANTED)], full=True, warmup=2, timeout=240, quiet=True,
                   env={**env, "RESULTS": str(profiled)}, cwd=str(tmp_path))  # fmt: skip
    res = run(spec, out_dir=tmp_path / "run")
    assert res.ok, res.error
    probes = res.ranks[0].data["probes"]
    assert "host_memory" in probes and "optimizer" in probes  # both step the optimizer they are given
    assert (profiled / "child-0.txt").read_text() == (plain / "child-0.txt").read_text()
    parent = (profiled / "parent.txt").read_text()
    assert parent == (plain / "parent.txt").read_text() and parent.split("\n")[1].startswith("True")
    [note] = [f for f in res.report().findings if f.id == "profile.children"]
    assert "parameters shared between them (Hogwild)" in note.evidence


@pytest.mark.slow
def test_child_that_crashes_is_quoted_with_its_steps(tmp_path):
    res, report = profile(tmp_path, steps=20, CRASH_AT="3", STEPS="30")
    assert res.status == "error"
    assert res.error.startswith("rank 1: RuntimeError: planted crash in child 1 at step 3 (at "), res.error
    assert f"planted_children.py:{CRASH_LINE})" in res.error
    assert len(res.ranks[1].warmup_steps + res.ranks[1].steps) >= 3  # what it measured before it raised
    assert res.ranks[0].status == "stopped" and len(res.ranks[0].steps) == 20
    assert "distributed.failure" in ids(report) and "profile.no_step" not in ids(report)
    stderr = (tmp_path / "run" / "stderr.txt").read_text()
    assert (
        "RuntimeError: planted crash in child 1" in stderr
    )  # multiprocessing still prints it, as without pitstop


@pytest.mark.slow
def test_child_the_script_terminates_is_stopped_and_still_dies_by_sigterm(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    spec = RunSpec(command=[sys.executable, str(PLANTED)], full=True, warmup=1, timeout=240, quiet=True,
                   probes=False, env={"TERMINATE": "1", "RESULTS": str(results)}, cwd=str(tmp_path))  # fmt: skip
    res = run(spec, out_dir=tmp_path / "run")
    assert res.ok and res.error is None, res.error
    assert res.ranks[1].status == "stopped" and res.ranks[1].data["distributed"]["signal"] == "SIGTERM"
    assert len(res.ranks[1].steps) >= 1 and res.ranks[0].status == "completed"
    assert (
        (results / "parent.txt").read_text().endswith("True [0, -15]")
    )  # the exit codes it sees without pitstop


@pytest.mark.slow
def test_ctrl_c_stops_every_child_and_reports(tmp_path):
    out, run_dir = tmp_path / "report.json", tmp_path / "run"
    cmd = [sys.executable, "-m", "pitstop", "profile", "--full", "--warmup", "1", "-q", "--json", str(out), "--out-dir", str(run_dir),
           "--", sys.executable, str(PLANTED)]  # fmt: skip
    env = {
        **os.environ,
        "STEPS": "100000",
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": str(HERE.parents[1] / "src"),
    }
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=tmp_path)
    deadline = time.monotonic() + 120
    pids: list[int] = []
    while time.monotonic() < deadline:  # both children are past their third step
        states = [json.loads(p.read_text()) for p in run_dir.glob("rank-*/state.json") if p.stat().st_size]
        if len(states) == 2 and all(s["step"] >= 3 for s in states):
            pids = [s["pid"] for s in states]
            break
        time.sleep(0.2)
    assert pids, "children never started"
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 130
    doc = json.loads(out.read_text())
    assert doc["meta"]["status"] == "interrupted"
    ranks = doc["sections"]["ranks"]
    assert {r["rank"]: r["status"] for r in ranks} == {0: "interrupted", 1: "interrupted"}
    assert all(r["measured_steps"] >= 1 for r in ranks)
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
