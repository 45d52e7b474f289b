"""Findings across ranks, skew, stuck-rank detection and the comm timing arithmetic, on made-up records."""

from __future__ import annotations

import pytest

from pitstop.findings import Severity
from pitstop.profile.analyze import dist_rules
from pitstop.profile.rank import comm, comm_hook
from pitstop.profile.runs import ranks
from pitstop.profile.runs.merge import quote


def summary(rank, step_s=0.1, data=0.0, backward=0.05, exposed=0.0, collective=0.0, rounds=1.0, **kw):
    bd = {k: 0.0 for k in dist_rules.PHASES}
    bd.update(mean_step_s=step_s, median_step_s=step_s, data_wait_s=data, backward_s=backward)
    bd["other_s"] = max(0.0, step_s - data - backward)
    return {
        "rank": rank,
        "status": "stopped",
        "host": kw.get("host", "h"),
        "measured_steps": 10,
        "world_size": 2,
        "breakdown": bd,
        "comm_per_step": {"collective_s": collective, "ddp_comm_s": exposed + 0.001, "ddp_exposed_s": exposed,
                          "ddp_rounds": rounds, "unused_search_s": kw.get("search", 0.0), "ddp_bytes": 1 << 20},
        "collective_sites": [],
        "ddp": kw.get("ddp", [{"location": "train.py:9", "parameters": 4}]),
        "backend": kw.get("backend", "gloo"),
        "devices": kw.get("devices", ["cpu"]),
        "env": kw.get("env", {}),
        "process": kw.get("process", {}),
    }  # fmt: skip


def test_straggler_is_the_busy_rank_and_its_phase():
    fast = summary(0, step_s=0.1, data=0.001, backward=0.09, exposed=0.08)
    slow = summary(1, step_s=0.1, data=0.08, backward=0.012, exposed=0.002)
    f = dist_rules.straggler([fast, slow])
    assert f is not None and f.data["rank"] == 1 and f.data["phase"] == "data_wait_s"
    assert f.data["others_wait_s"] == {0: pytest.approx(0.08)}
    assert f.est_saving_s == pytest.approx(0.078)
    assert "rank 0 80 ms" in f.evidence


def test_no_straggler_when_ranks_are_even():
    a = summary(0, data=0.01, exposed=0.002)
    b = summary(1, data=0.011, exposed=0.0015)
    assert dist_rules.straggler([a, b]) is None


def test_comm_exposed_uses_the_rank_that_waited_least():
    a = summary(0, exposed=0.05)
    b = summary(1, exposed=0.02)
    f = dist_rules.comm_exposed([a, b])
    assert f.data["rank"] == 1 and f.est_saving_s == pytest.approx(0.02)


def test_no_sync_counts_extra_rounds():
    f = dist_rules.no_sync([summary(0, rounds=4.0, exposed=0.04)])
    assert f.data["extra_rounds"] == 3.0 and f.est_saving_s == pytest.approx(0.03)
    assert dist_rules.no_sync([summary(0, rounds=1.0)]) is None


def test_find_unused_reports_whether_the_flag_is_needed():
    ddp = [{"find_unused_parameters": True, "unused_parameters": 0, "parameters": 6, "location": "t.py:3"}]
    f = dist_rules.find_unused([summary(0, ddp=ddp, search=0.01)])
    assert "not needed" in f.evidence and f.est_saving_s == 0.01 and f.location == "t.py:3"


def test_threads_oversubscribed_and_split():
    proc = {"intra_op_threads": 8, "affinity": list(range(8)), "cpu_count": 8}
    f = dist_rules.threads([summary(0, process=proc), summary(1, process=proc)])
    assert f.data == {"host": "h", "threads": 16, "cpus": 8, "overlap": True, "per_rank": 4}
    assert "OMP_NUM_THREADS=4" in f.fix_code
    own = [{"intra_op_threads": 4, "affinity": list(range(r * 4, r * 4 + 4)), "cpu_count": 8} for r in (0, 1)]
    assert dist_rules.threads([summary(0, process=own[0]), summary(1, process=own[1])]) is None


def test_backend_gloo_with_cuda_and_nccl_debug_env():
    found = dist_rules.backend(
        [summary(0, devices=["cuda"], env={"NCCL_DEBUG": "INFO", "NCCL_SOCKET_IFNAME": "x"})]
    )
    assert [f.severity.value for f in found] == ["warn", "info"]
    assert found[1].data["env"] == {"NCCL_DEBUG": "INFO"}
    assert dist_rules.backend([summary(0, backend="nccl", devices=["cuda"])]) == []


def test_skew_matches_calls_by_kind_and_sequence():
    calls = {
        0: [{"op": "all_reduce", "seq": i, "step": i, "enter_s": 10.0 + i} for i in range(4)],
        1: [{"op": "all_reduce", "seq": i, "step": i, "enter_s": 10.03 + i} for i in range(4)],
    }
    sk = dist_rules.skew_summary(calls, warmup=1)["all_reduce"]
    assert sk["calls"] == 3 and sk["last_rank"] == {"1": 3}
    assert sk["median_skew_s"] == pytest.approx(0.03)


def test_stuck_needs_an_ended_rank_and_a_long_wait():
    now = 1000.0
    waiting = {
        "alive": True,
        "step": 7,
        "current": {"what": "all_reduce", "location": "t.py:5", "since_s": now - 30},
    }
    gone = {"alive": False, "step": 7, "status": None, "current": None}
    msg = ranks.stuck({0: waiting, 1: gone}, now=now)
    assert msg.startswith(
        "rank 1 ended (process gone) at step 7, while rank 0 waiting in all_reduce at t.py:5"
    )
    assert ranks.stuck({0: waiting, 1: {**gone, "alive": True}}, now=now) is None
    assert (
        ranks.stuck({0: {**waiting, "current": {**waiting["current"], "since_s": now - 1}}, 1: gone}, now=now)
        is None
    )


class FakeEvent:
    """A CUDA event that says when it was recorded (seconds, on a made-up GPU clock)."""

    def __init__(self, t):
        self.t = t

    def elapsed_time(self, other):
        return (other.t - self.t) * 1000.0


def test_spans_cpu_and_cuda_events():
    cpu = {
        "buckets": [
            {"launch": 0.0, "done": 0.5, "events": None},
            {"launch": 0.4, "done": 1.0, "events": None},
        ]
    }
    assert comm_hook.spans_of(cpu) == (pytest.approx(1.0), pytest.approx(0.6))
    gpu = {"buckets": [{"launch": 0, "done": 9, "events": [FakeEvent(1.0), FakeEvent(1.2)]},
                       {"launch": 0, "done": 9, "events": [FakeEvent(1.5), FakeEvent(1.9)]}]}  # fmt: skip
    comm_s, exposed = comm_hook.spans_of(gpu)  # host times ignored when every bucket has its events
    assert comm_s == pytest.approx(0.6) and exposed == pytest.approx(0.4)
    assert comm_hook.spans_of({"buckets": [{"launch": 0.0, "done": None, "events": None}]}) is None


def test_timed_hook_records_buckets_and_keeps_the_value():
    import torch

    rec = comm.CommRecorder(step_of=lambda: 3)
    value = torch.ones(4)

    class Bucket:
        def buffer(self):
            return value

        def is_last(self):
            return True

    fut = torch.futures.Future()
    hook = rec.timed_hook(lambda state, bucket: fut, torch.nn.Linear(1, 1))
    out = hook(None, Bucket())
    assert rec.current[0] == "DDP gradient all-reduce"
    fut.set_result(value * 2)
    assert torch.equal(out.wait(), value * 2)
    assert rec.current is None
    snap = rec.snapshot()
    assert snap["per_step"]["3"]["ddp_rounds"] == 1 and snap["per_step"]["3"]["ddp_bytes"] == 16


def test_timed_hook_pickles_and_copies_to_the_hook_it_wraps():
    import copy
    import pickle

    import torch
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    m = torch.nn.Linear(1, 1)
    hook = comm.CommRecorder().timed_hook(default_hooks.allreduce_hook, m)
    assert pickle.loads(pickle.dumps(hook)) is default_hooks.allreduce_hook
    assert copy.deepcopy(hook) is default_hooks.allreduce_hook
    assert hook.__qualname__ == "allreduce_hook"


def test_quote_keeps_first_line_and_location():
    err = "RuntimeError: " + "x" * 400 + "\nmore\nlines (at train.py:44)"
    q = quote(err)
    assert q.startswith("RuntimeError: xxx") and q.endswith("... (at train.py:44)") and "more" not in q
    assert quote("ValueError: bad (at t.py:3)") == "ValueError: bad (at t.py:3)"


def test_a_rank_waiting_at_the_stop_counts_as_gone_for_a_peer_stuck_in_a_collective():
    now = 1000.0
    at_stop = {"alive": True, "step": 8, "stopping": 8, "current": {"what": "pitstop's stop", "location": None,
                                                                     "since_s": now - 30}}  # fmt: skip
    waiting = {
        "alive": True,
        "step": 4,
        "current": {"what": "all_reduce", "location": "t.py:5", "since_s": now - 30},
    }
    msg = ranks.stuck({0: at_stop, 1: waiting}, now=now)
    assert msg.startswith("rank 0 measured its steps and waits to stop after step 8, while rank 1 waiting in")
    # both at the stop (one slow to get there): nobody is stuck
    assert ranks.stuck({0: at_stop, 1: {**at_stop, "stopping": None, "current": None}}, now=now) is None
    assert ranks.stuck({0: at_stop, 1: dict(at_stop)}, now=now) is None


def test_builtin_comm_hook_is_said_to_be_untimed():
    ddp = [{"location": "train.py:9", "parameters": 4, "hook": "BuiltinCommHookType.FP16_COMPRESS",
            "hook_untimed": "a built-in C++ comm hook: its buckets are not timed"}]  # fmt: skip
    f = dist_rules.comm_untimed([summary(0, ddp=ddp)])
    assert f.id == "distributed.comm_untimed" and f.severity is Severity.INFO
    assert "FP16_COMPRESS" in f.evidence and "not timed" in f.evidence and f.location == "train.py:9"
    assert dist_rules.comm_untimed([summary(0)]) is None


def test_accelerate_cpu_launch_that_ran_fewer_processes_than_asked():
    cmd = ["accelerate", "launch", "--cpu", "--num_processes", "2", "train.py"]
    f = dist_rules.fewer_processes("accelerate", cmd, 1)
    assert f.id == "distributed.processes" and f.data == {"requested": 2, "ranks": 1}
    assert "mpirun" in f.evidence and "--multi_gpu" in f.fix_code
    assert (
        dist_rules.fewer_processes("accelerate", ["accelerate", "launch", "--num_processes=2", "t.py"], 2)
        is None
    )
    assert dist_rules.fewer_processes("torchrun", cmd, 1) is None
