"""rank_share: a job across nodes shares its ranks' states and records through a real TCPStore on loopback;
ranks.stuck names the rank that never entered the collective another waits in."""

from __future__ import annotations

import json
import threading
import time
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist

from pitstop.profile.process.command import slurm_task
from pitstop.profile.rank import rank_share, rank_states, rank_stop
from pitstop.profile.rank.rank_share import Shared
from pitstop.profile.rank.rank_worker import Identity, identity
from pitstop.profile.runs import ranks


def _store(port: int = 0, master: bool = False) -> dist.TCPStore:
    return dist.TCPStore("127.0.0.1", port, is_master=master, timeout=timedelta(seconds=10),
                         wait_for_workers=False)  # fmt: skip


def _node(tmp_path: Path, name: str, rank: int, node: int, port: int, world: int = 2) -> Shared:
    return Shared("job", rank, world, node, tmp_path / name, store=_store(port))


def _state(rank: int, node: int, step: int = 3, **extra) -> dict:
    return {"rank": rank, "node": node, "host": f"host{node}", "pid": 1, "time_s": time.time(), "step": step,
            "current": None, "entered": step, **extra}  # fmt: skip


def test_each_node_gets_the_other_nodes_states_then_their_records(tmp_path, monkeypatch):
    monkeypatch.setattr(rank_share, "ACK_WAIT_S", 0.5)  # node b never copies: its acknowledgement won't come
    master = _store(master=True)
    a, b = _node(tmp_path, "a", 0, 0, master.port), _node(tmp_path, "b", 1, 1, master.port)
    a.publish_state(_state(0, 0))
    b.publish_state(_state(1, 1, step=5))
    for node in (a, b):  # a set is not answered: a round trip on the same connection waits it out
        node.store().num_keys()
    a.copy_states()
    b.copy_states()
    got = json.loads((tmp_path / "a" / "rank-1" / "state.json").read_text())
    assert got["step"] == 5 and got["remote"] is True and got["stale"] is False
    assert not (tmp_path / "a" / "rank-0").exists()  # its own rank writes its own folder
    assert json.loads((tmp_path / "b" / "rank-0" / "state.json").read_text())["host"] == "host0"

    record = {"version": 1, "status": "stopped", "steps": [{"index": 0, "total_s": 0.01}]}
    b.publish_record(
        {"measurements": record, "watchdog": {"hangs": []}, "state": {**_state(1, 1), "status": "stopped"}}
    )
    assert a.copy_records(wait_s=5) == []
    folder = tmp_path / "a" / "rank-1"
    assert json.loads((folder / "measurements.json").read_text()) == record
    assert json.loads((folder / "watchdog.json").read_text()) == {"hangs": []}
    assert json.loads((folder / "state.json").read_text())["status"] == "stopped"


def test_a_record_that_never_comes_is_said_so_once_its_rank_went_silent(tmp_path, monkeypatch):
    monkeypatch.setattr(rank_share, "STALE_S", 0.3)
    master = _store(master=True)
    a = _node(tmp_path, "a", 0, 0, master.port)
    _node(tmp_path, "b", 1, 1, master.port).publish_state(_state(1, 1, step=9))
    t0 = time.monotonic()
    assert a.copy_records(wait_s=20) == [1]
    assert time.monotonic() - t0 < 10  # silent: not waited for to the end of wait_s
    rec = json.loads((tmp_path / "a" / "rank-1" / "measurements.json").read_text())
    assert rec["remote_missing"] and "no final record came from rank 1 on host1" in rec["error"]
    assert "step 9" in rec["error"]


def test_a_rank_still_publishing_is_waited_for(tmp_path, monkeypatch):
    """Rank 0 of a job runs its exit probes after the others ended: its record comes late."""
    monkeypatch.setattr(rank_share, "STALE_S", 0.5)
    monkeypatch.setattr(rank_share, "ACK_WAIT_S", 0.5)
    master = _store(master=True)
    b = _node(tmp_path, "b", 1, 1, master.port)
    late = _node(tmp_path, "a", 0, 0, master.port)
    late.publish_state(_state(0, 0))
    done = threading.Event()

    def probing() -> None:  # keeps publishing (a fresh time each second), then its record
        for _ in range(15):
            late.publish_state(_state(0, 0))
            time.sleep(0.1)
        late.publish_record({"measurements": {"version": 1, "status": "stopped", "steps": []}, "state": {}})
        done.set()

    t = threading.Thread(target=probing)
    t.start()
    assert b.copy_records(wait_s=20) == []
    t.join()
    assert done.is_set()
    assert json.loads((tmp_path / "b" / "rank-0" / "measurements.json").read_text())["status"] == "stopped"


def test_a_shared_folder_is_never_copied_into(tmp_path):
    master = _store(master=True)
    a = _node(tmp_path, "shared", 0, 0, master.port)
    own = tmp_path / "shared" / "rank-1"
    own.mkdir(parents=True)
    (own / rank_share.RUN_CONFIG).write_text("{}")  # rank 1 writes here itself
    _node(tmp_path, "other", 1, 1, master.port).publish_state(_state(1, 1))
    a.copy_states()
    assert not (own / "state.json").exists()
    assert a.copy_records(wait_s=1) == []


def test_identity_from_torchrun_or_slurm_and_the_job_id(monkeypatch):
    two_nodes = identity(
        {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1"}
    )
    assert two_nodes == Identity(rank=3, world=4, local_rank=1, local_world=2, node=1)
    assert two_nodes.world > two_nodes.local_world and not two_nodes.first
    one_node = identity({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2"})
    assert one_node.world == one_node.local_world and one_node.first
    # a task of srun runs one rank under its own pitstop; its node's first task copies the other nodes'
    task = identity({"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "0", "SLURM_NODEID": "1"})
    assert task == Identity(rank=5, world=8, local_rank=0, local_world=1, node=1) and task.first
    assert slurm_task({"SLURM_PROCID": "5", "SLURM_NTASKS": "8"})
    assert not slurm_task({"SLURM_PROCID": "0", "SLURM_NTASKS": "1"})
    assert not slurm_task({"SLURM_PROCID": "0", "SLURM_NTASKS": "8", "RANK": "0"})  # torchrun inside srun
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    # the same on every node of the job, whatever each node's run folder is called
    assert (
        rank_stop.job_id("pitstop-ranks-abc")
        == rank_stop.job_id("pitstop-ranks-xyz")
        == "none@10.0.0.1:29500"
    )
    monkeypatch.delenv("TORCHELASTIC_RUN_ID")
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("SLURM_STEP_ID", "3")
    assert rank_stop.job_id("x") == "slurm-77.3"
    monkeypatch.delenv("SLURM_JOB_ID")
    assert rank_stop.job_id("x") == "x"


def test_stuck_names_the_rank_that_never_entered_the_collective():
    now = 1000.0
    blocked = {
        "alive": True,
        "step": 8,
        "entered": 18,
        "progress_s": now - 30,
        "current": {"what": "all_reduce", "location": "t.py:18", "since_s": now - 30, "n": 18, "bytes": 4},
    }
    sleeping = {"alive": True, "step": 8, "entered": 17, "progress_s": now - 30, "current": None,
                "at": "t.py:13", "call": "time.sleep", "remote": True, "host": "node-b"}  # fmt: skip
    msg = ranks.stuck({0: blocked, 1: sleeping}, now=now)
    assert msg.startswith(
        "rank 1 on node-b at step 8, at t.py:13 in time.sleep, 17 collectives entered: it never entered "
        "rank 0's collective #18, while rank 0 waiting in all_reduce (collective #18, 4 B) at t.py:18"
    )
    # a peer that is still making progress, or already entered that collective, is not what rank 0 waits for
    assert ranks.stuck({0: blocked, 1: {**sleeping, "progress_s": now - 1}}, now=now) is None
    assert ranks.stuck({0: blocked, 1: {**sleeping, "entered": 18}}, now=now) is None


def test_a_remote_rank_gone_silent_counts_as_ended(tmp_path):
    run = tmp_path / "run"
    for r, st in {0: {"host": rank_states.HOST, "pid": 1 << 22}, 1: {"host": "elsewhere", "stale": True}}.items():
        (run / f"rank-{r}").mkdir(parents=True)
        (run / f"rank-{r}" / "state.json").write_text(json.dumps({"rank": r, **st}))
    states = rank_states.read_states(run)
    assert states[1]["alive"] is False
    (run / "rank-1" / "state.json").write_text(json.dumps({"rank": 1, "host": "elsewhere", "stale": False}))
    assert rank_states.read_states(run)[1]["alive"] is True
