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
from pitstop.profile.process.children import Followed, Follower, _user_target, claim_index
from pitstop.profile.runs.runner import RunSpec, run
from pitstop.report.jsonfmt import load_schema

HERE = Path(__file__).resolve().parent
PLANTED = HERE / "planted_children.py"
EXAMPLES = HERE.parents[1] / "examples"
CRASH_LINE = next(
    i for i, ln in enumerate(PLANTED.read_text().splitlines(), 1) if "raise RuntimeError(" in ln
)
HANG_LINE = next(i for i, ln in enumerate(PLANTED.read_text().splitlines(), 1) if "# HANG" in ln)


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


def test_start_carries_the_target_in_a_picklable_wrapper_only_while_starting(tmp_path):
    cfg = {"steps": 3, "out_dir": str(tmp_path)}
    follower = Follower(inst=None, cfg=cfg)
    seen = []

    def start(proc):  # what BaseProcess.start does: the child gets the target, then the object drops it
        seen.append(pickle.loads(pickle.dumps(proc._target)))  # spawn and forkserver pickle the process
        del proc._target, proc._args

    proc = multiprocessing.Process(target=_train, args=(0,))
    follower.start(start, proc)
    [carried] = seen
    assert isinstance(carried, Followed) and carried.target is _train and carried.cfg == cfg
    assert carried.index == 0 and not carried.pool and carried.parent is None
    assert not hasattr(proc, "_target") and not hasattr(proc, "_args")  # as without pitstop

    def fails(proc):
        raise OSError("cannot start")

    proc = multiprocessing.Process(target=_train, args=(0,))
    with pytest.raises(OSError):
        follower.start(fails, proc)
    assert proc._target is _train and proc._args == (0,)


def test_pool_workers_are_followed_and_numbers_are_claimed_across_processes(tmp_path):
    from multiprocessing.pool import worker

    cfg = {"out_dir": str(tmp_path)}
    claim_index(tmp_path)  # another process of the run took 0
    seen = []

    def start(proc):
        seen.append(pickle.loads(pickle.dumps(proc._target)))

    Follower(inst=None, cfg=cfg, parent=0).start(
        start, multiprocessing.Process(target=worker, args=(None, None))
    )
    [carried] = seen
    assert carried.pool and carried.target is worker and carried.index == 1 and carried.parent == 0


@pytest.mark.slow
@pytest.mark.parametrize("start", ["fork", "spawn"])
def test_pool_workers_are_measured_and_stop_the_map_cleanly(tmp_path, start):
    """Pool.map of the training: each worker is a child; the first to measure its steps stops, its stop
    reaches the script's map as a clean stop, and the pool's terminate() ends the other as stopped."""
    res, report = profile(tmp_path, LAUNCH="pool", START=start)
    assert res.ok, res.error
    assert report.meta["start_methods"] == [start] and sorted(res.ranks) == [0, 1]
    assert all(r.status == "stopped" for r in res.ranks.values())
    assert max(len(r.steps) for r in res.ranks.values()) == 4
    assert all(len(r.warmup_steps + r.steps) >= 1 for r in res.ranks.values())
    assert all(r.data["distributed"]["child"]["pool_worker"] for r in res.ranks.values())
    assert res.parent is not None and res.parent.status == "stopped"
    [note] = [f for f in report.findings if f.id == "profile.children"]
    assert "ForkPoolWorker" in note.evidence or "SpawnPoolWorker" in note.evidence


@pytest.mark.slow
def test_pool_workers_train_to_the_end_with_full(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    spec = RunSpec(command=[sys.executable, str(PLANTED)], full=True, warmup=1, timeout=240, quiet=True,
                   probes=False, env={"LAUNCH": "pool", "RESULTS": str(results), "OMP_NUM_THREADS": "1"},
                   cwd=str(tmp_path))  # fmt: skip
    res = run(spec, out_dir=tmp_path / "run")
    assert res.ok, res.error
    assert {r: len(x.steps) for r, x in res.ranks.items()} == {0: 11, 1: 11}
    assert (results / "parent.txt").read_text().endswith("pool [0, 1]")  # map's results, as without pitstop


@pytest.mark.slow
@pytest.mark.parametrize("start", ["fork", "spawn"])
def test_grandchildren_are_followed(tmp_path, start):
    res, report = profile(tmp_path, LAUNCH="nested", START=start)
    assert res.ok, res.error
    assert {r: (x.status, len(x.steps)) for r, x in res.ranks.items()} == {
        0: ("stopped", 4),
        1: ("stopped", 4),
    }
    facts = {r: x.data["distributed"]["child"] for r, x in res.ranks.items()}
    assert facts[0]["parent"] is None and facts[1]["parent"] == 0
    assert report.meta["children"] == 2


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
def test_child_that_hangs_is_named_with_its_line_and_stacks_at_the_timeout(tmp_path):
    """Child 1 sleeps forever in its step 3; --timeout stops the run: the error names the child, its pid,
    the line and the call it waits in, and its profile.hang finding carries its stacks."""
    spec = RunSpec(command=[sys.executable, str(PLANTED)], steps=4, warmup=1, timeout=30, quiet=True,
                   probes=False, env={"HANG_AT": "3", "STEPS": "30", "OMP_NUM_THREADS": "1"},
                   cwd=str(tmp_path))  # fmt: skip
    res = run(spec, out_dir=tmp_path / "run")
    assert res.status == "timeout" and not res.ok
    pid = res.ranks[1].data["distributed"]["pid"]
    where = f"planted_children.py:{HANG_LINE}"
    assert f"child 1 (pid {pid}, ForkProcess-2) hung at " in res.error, res.error
    assert f"{where} in time.sleep: no progress for " in res.error
    assert res.ranks[0].status == "stopped" and len(res.ranks[0].steps) == 4
    assert res.ranks[1].hang["main"]["where"].endswith(where)
    assert len(res.ranks[1].warmup_steps + res.ranks[1].steps) == 3  # its steps before the hang are kept
    report = res.report()
    [hang] = [f for f in report.findings if f.id == "profile.hang"]
    assert hang.title.startswith("rank 1: Training hung at ") and hang.location.endswith(where)
    assert hang.data["rank"] == 1 and hang.data["kind"] == "sleep"
    main = next(t for t in hang.data["threads"] if t["main"])
    assert any(fr["file"].endswith("planted_children.py") for fr in main["frames"])
    assert report.sections["distributed"]["hang"].startswith("child 1 (pid ")


@pytest.mark.slow
@pytest.mark.parametrize("sig", ["KILL", "INT"])
def test_child_killed_or_interrupted_keeps_its_steps_and_says_how_it_ended(tmp_path, sig):
    """Child 1 gets SIGKILL (no chance to write its record: its periodic one is kept, and the exit code its
    parent saw says how it ended) or SIGINT (its own Ctrl-C: it writes its record) in its step 3."""
    res, report = profile(tmp_path, SIGNAL_AT="3", SIGNAL=sig, STEPS="30", PITSTOP_PROFILE_FLUSH_S="0")
    child = res.ranks[1]
    assert len(child.warmup_steps + child.steps) == 3  # the steps it took before the signal
    assert res.ranks[0].status == "stopped" and len(res.ranks[0].steps) == 4
    if sig == "KILL":
        assert child.status == "killed" and res.status == "killed"
        assert res.error.startswith("rank 1: killed by SIGKILL; measurements up to its last periodic record")
    else:
        assert child.status == "interrupted" and res.error.startswith("rank 1: interrupted (SIGINT)"), (
            res.error
        )
    assert res.parent is not None and res.parent.status == "completed"
    assert "distributed.failure" in ids(report) and "profile.no_step" not in ids(report)


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
