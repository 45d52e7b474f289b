"""The watchdog, the stack reader and the progress rules in-process: real blocked threads, a fake
instrumentation driven tick by tick (no sleeps as synchronisation), synthetic watchdog records."""

from __future__ import annotations

import json
import queue
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from pitstop.findings import Severity
from pitstop.profile.analyze.rules import findings_for
from pitstop.profile.analyze.rules_progress import progress_rules
from pitstop.profile.capture.stacks import describe, frames_of
from pitstop.profile.capture.stepclock import StepClock
from pitstop.profile.capture.watchdog import (
    REQUEST_FILE,
    WATCHDOG_FILE,
    Watchdog,
    hang_summary,
    hang_verdict,
    read_watchdog,
)
from pitstop.profile.record.timeline import StepRecord
from pitstop.profile.runs.runner import RunResult

# ----------------------------------------------------------------------------------------- stacks


def _blocked(target, call: str) -> dict:
    """Start ``target`` in a thread; its stack as ``describe`` reads it once it is in ``call``."""
    t = threading.Thread(target=target, daemon=True)
    t.start()
    for _ in range(5000):
        frame = sys._current_frames().get(t.ident)
        d = describe(frames_of(frame)) if frame is not None else {}
        if d.get("call") == call:
            return d
        time.sleep(0.001)
    raise AssertionError(f"the thread never reached {call}")


def test_describe_names_the_user_line_and_the_blocking_call():
    q: queue.Queue = queue.Queue()
    ev = threading.Event()

    def waits_on_queue():
        q.get()  # QUEUE

    def waits_on_event():
        ev.wait()  # EVENT

    def sleeps():
        time.sleep(30)  # SLEEP

    lines = {m: _line(m) for m in ("# QUEUE", "# EVENT", "# SLEEP")}
    try:
        d = _blocked(waits_on_queue, "queue.Queue.get")
        assert d["kind"] == "queue" and d["inner"] == "threading.Condition.wait"
        assert (
            d["where"].endswith(f"test_profile_watchdog.py:{lines['# QUEUE']}")
            and d["code"] == "q.get()  # QUEUE"
        )
        d = _blocked(waits_on_event, "threading.Event.wait")
        assert d["kind"] == "lock" and d["where"].endswith(str(lines["# EVENT"]))
        d = _blocked(sleeps, "time.sleep")
        assert d["kind"] == "sleep" and d["where"].endswith(str(lines["# SLEEP"]))
    finally:
        q.put(None)
        ev.set()


def _line(marker: str) -> int:
    text = Path(__file__).read_text().splitlines()
    return next(i for i, s in enumerate(text, 1) if s.rstrip().endswith(marker) and "_line(" not in s)


# --------------------------------------------------------------------------------------- watchdog


def fake_inst(tmp_path: Path) -> SimpleNamespace:
    return SimpleNamespace(
        cfg=SimpleNamespace(out_dir=tmp_path, warmup=1, callback=None),
        callback_requested=False,
        t0=0.0,
        records=[],
        counts={"batches": 0, "forwards": 0, "backwards": 0, "optimizer_steps": 0},
        clock=StepClock(),
        worker_pools=[],
    )


def step(inst: SimpleNamespace, start: float, total: float) -> None:
    """One step as the instrumentation sees it: a batch, an optimizer step, the next step's boundary."""
    n = len(inst.records)
    inst.counts["batches"] += 1
    inst.counts["optimizer_steps"] += 1
    inst.clock.optimizer_stepped(inst, start + total * 0.9)
    inst.records.append({"index": n, "start_s": start, "total_s": total})
    inst.clock.begin(start + total)


def test_watchdog_dumps_a_hang_after_the_floor_and_marks_it_recovered(tmp_path):
    inst = fake_inst(tmp_path)
    wd = Watchdog(inst, poll_s=0.1, hang_floor_s=5.0)
    wd._progress_at = 0.0
    for i in range(10):
        step(inst, i * 0.01, 0.01)
    wd._tick(0.1)
    wd._tick(4.0)
    assert wd.state["hangs"] == []  # 3.9 s without progress < the 5 s floor
    wd._tick(5.2)
    (hang,) = wd.state["hangs"]
    assert (
        hang["reason"] == "hang"
        and hang["steps_done"] == 10
        and hang["since_progress_s"] == pytest.approx(5.1)
    )
    assert hang["last_step"]["index"] == 9 and hang["main"]["where"]  # the main thread: this test
    wd._tick(9.0)
    assert len(wd.state["hangs"]) == 1  # one dump per stretch without progress
    step(inst, 9.0, 0.01)
    wd._tick(9.1)
    assert hang["recovered_after_s"] == pytest.approx(9.1 - hang["at_s"])
    saved = json.loads((tmp_path / WATCHDOG_FILE).read_text())
    assert saved["hangs"][0]["recovered_after_s"] is not None
    assert hang_verdict(saved, "timeout") is None  # recovered, and no stop dump


def test_a_hang_after_the_open_steps_optimizer_step_names_that_step(tmp_path):
    inst = fake_inst(tmp_path)
    wd = Watchdog(inst, poll_s=0.1, hang_floor_s=1.0)
    wd._progress_at = 0.0
    for i in range(3):
        step(inst, i * 0.01, 0.01)
    inst.clock.optimizer_stepped(inst, 0.04)  # step 3 stepped; the next boundary never comes
    wd._tick(0.1)
    wd._tick(2.0)
    (hang,) = wd.state["hangs"]
    assert hang["last_step"] == {"index": 3, "ended_s_ago": pytest.approx(1.96)}


def test_watchdog_samples_a_slow_step_and_answers_a_stop_request(tmp_path):
    inst = fake_inst(tmp_path)
    wd = Watchdog(inst, poll_s=0.1, hang_floor_s=30.0)
    for i in range(10):
        step(inst, i * 0.02, 0.02)
    start = inst.clock.step_start
    wd._tick(start + 0.05)
    assert wd.state["samples"] == []
    wd._tick(start + 0.25)  # > 10 x the 20 ms median and > median + 0.1 s
    wd._tick(start + 0.3)  # the next sample waits for 2x that
    (s,) = wd.state["samples"]
    assert s["step"] == 10 and s["elapsed_s"] == pytest.approx(0.25)
    assert any(
        f["function"].endswith("test_watchdog_samples_a_slow_step_and_answers_a_stop_request")
        for f in s["frames"]
    )
    (tmp_path / REQUEST_FILE).write_text("timeout")
    wd._tick(start + 0.4)
    assert not (tmp_path / REQUEST_FILE).exists()
    saved = read_watchdog(tmp_path, "timeout")
    assert saved["stop"]["reason"] == "timeout" and saved["stop"]["threads"]
    # 0.35 s without progress at the stop: under the 1 s a stopped run needs to count as hung
    assert saved["hang"] is None
    assert progress_rules({"watchdog": saved, "steps": inst.records})[0].id == "profile.timeout"


def test_watchdog_notes_a_thread_that_died(tmp_path):
    inst = fake_inst(tmp_path)
    wd = Watchdog(inst).start()
    try:

        def dies():
            raise ValueError("producer lost")  # DIES

        seen = []
        old = wd._prev_excepthook
        wd._prev_excepthook = seen.append  # keep pytest's output clean
        t = threading.Thread(target=dies, name="producer")
        t.start()
        t.join()
        wd._prev_excepthook = old
    finally:
        wd.stop()
    (dead,) = wd.state["dead_threads"]
    assert dead["name"] == "producer" and dead["error"] == "ValueError: producer lost"
    died_at = _line("# DIES")
    assert dead["where"].endswith(f"test_profile_watchdog.py:{died_at}")
    assert len(seen) == 1 and threading.excepthook is not wd._excepthook


# ------------------------------------------------------------------------------------------ rules


def dump(since: float, median: float | None = 0.01, reason: str = "timeout", kind: str = "queue") -> dict:
    return {
        "reason": reason,
        "at_s": 30.0,
        "since_progress_s": since,
        "median_step_s": median,
        "steps_done": 8,
        "last_step": {"index": 7, "ended_s_ago": since},
        "batches": 8,
        "forwards": 8,
        "main": {"where": "train.py:40", "code": "x = q.get()", "call": "queue.Queue.get", "kind": kind},
        "threads": [{"name": "MainThread", "main": True, "frames": [], "blocked": {}}],
        "loaders": [],
        "dead_threads": [{"name": "producer", "error": "ValueError: boom", "where": "train.py:12"}],
        "callback_running": False,
    }


def records(n: int = 20, total: float = 0.01, slow: dict | None = None) -> list[dict]:
    slow = slow or {}
    out, t = [], 0.0
    for i in range(n):
        d = slow.get(i, total)
        out.append({"index": i, "start_s": t, "total_s": d, "warmup": i < 2})
        t += d
    return out


def run_findings(data: dict) -> list:
    steps = [StepRecord.from_dict(r) for r in data["steps"] if not r.get("warmup")]
    return findings_for(steps, data, cores=4)[0]


def test_stopped_while_blocked_is_a_hang_and_never_healthy():
    wd = {"stop": dump(23.5), "run_status": "timeout", "hangs": []}
    wd["hang"] = hang_verdict(wd, "timeout")
    found = run_findings({"watchdog": wd, "steps": records()})
    ids = [f.id for f in found]
    assert "profile.hang" in ids and "summary.healthy" not in ids
    f = next(f for f in found if f.id == "profile.hang")
    assert f.severity is Severity.ERROR and f.location == "train.py:40"
    assert "No progress for 23.5 s" in f.evidence and "8 steps completed" in f.evidence
    assert "thread 'producer' died with ValueError: boom (at train.py:12)" in f.evidence
    assert hang_summary(wd) == "hung at train.py:40 in queue.Queue.get: no progress for 23.5 s"


def test_stopped_while_progressing_is_a_timeout_not_a_hang():
    wd = {"stop": dump(0.02), "run_status": "timeout", "hangs": []}
    wd["hang"] = hang_verdict(wd, "timeout")
    assert wd["hang"] is None
    found = run_findings({"watchdog": wd, "steps": records()})
    ids = [f.id for f in found]
    assert "profile.timeout" in ids and "profile.hang" not in ids and "summary.healthy" not in ids


def test_completed_run_with_a_recovered_hang_dump_is_not_hung():
    wd = {"hangs": [{**dump(31.0, reason="hang"), "recovered_after_s": 2.0}], "stop": None}
    assert hang_verdict(wd, "completed") is None and hang_verdict(wd, "interrupted") is None
    open_hang = {"hangs": [dump(31.0, reason="hang")], "stop": None}
    assert hang_verdict(open_hang, "interrupted")["since_progress_s"] == 31.0
    assert hang_verdict(open_hang, "error") is None  # the error is the report


def test_gil_held_hang_says_so():
    wd = {"stop": None, "hangs": [], "unanswered": True, "run_status": "killed", "hang": None, "samples": []}
    (f,) = [f for f in progress_rules({"watchdog": wd, "steps": records()}) if f.id == "profile.hang"]
    assert "GIL" in f.title


def test_periodic_slow_steps_are_one_stall_finding_with_what_ran():
    recs = records(45, slow={20: 3.0, 40: 3.0})
    sample = {
        "step": 20,
        "elapsed_s": 0.3,
        "main": {"where": "train.py:9", "code": "time.sleep(3)", "call": "time.sleep", "kind": "sleep"},
        "frames": [{"file": "train.py", "line": 9, "function": "save_checkpoint", "user": True, "code": ""}],
    }
    found = run_findings({"watchdog": {"samples": [sample]}, "steps": recs})
    f = next(f for f in found if f.id == "profile.stall")
    assert f.data["steps"] == [20, 40] and "every 20 steps" in f.evidence
    assert f.location == "train.py:9" and "1 of 2 stalled steps sampled" in f.evidence
    # over the 43 measured steps: the two warm-up steps are left out
    assert f.severity is Severity.WARN and f.est_saving_s == pytest.approx(2 * (3.0 - 0.01) / 43)
    assert "a checkpoint save (save_checkpoint)" in f.title + f.evidence


def test_noise_is_not_a_stall():
    recs = records(40, slow={10: 0.05, 30: 0.08})  # 5-8x a 10 ms step: under 10x
    assert [f.id for f in progress_rules({"steps": recs})] == []
    recs = records(40, total=0.001, slow={10: 0.02})  # 20x, but only 19 ms more: timer noise
    assert [f.id for f in progress_rules({"steps": recs})] == []


def test_dead_worker_finding_with_the_failing_line():
    wd = {
        "run_status": "error",
        "end": {
            "loaders": [
                {
                    "location": "train.py:20",
                    "num_workers": 2,
                    "workers": [
                        {"pid": 11, "alive": False, "exitcode": -9},
                        {"pid": 12, "alive": True, "exitcode": None},
                    ],
                    "pending_batches": 3,
                    "batches_received": 30,
                    "batches_per_epoch": 100,
                }
            ]
        },
    }
    from torch.utils.data import dataloader

    tb = (
        'Traceback (most recent call last):\n  File "/work/proj/train.py", line 22, in <module>\n'
        f'    for x, y in loader:\n  File "{dataloader.__file__}", line 700, in __next__\n'
        "    data = self._next_data()\nRuntimeError: DataLoader worker exited\n"
    )
    found = progress_rules({"watchdog": wd, "steps": records(), "traceback": tb, "error": "RuntimeError: x"})
    (f,) = [f for f in found if f.id == "dataloader.worker_died"]
    assert f.severity is Severity.ERROR and f.location.endswith("train.py:22")
    assert (
        "killed by SIGKILL" in f.evidence
        and "about 30 of 100 batches" in f.evidence
        and "__next__" in f.evidence
    )


# --------------------------------------------------------------------------------- fix and tune


def test_fix_and_tune_report_a_hung_candidate_as_hung(monkeypatch):
    from pitstop.fix.core import Measured
    from pitstop.tune import script

    hung = RunResult(
        returncode=-2,
        error="hung at train.py:40 in queue.Queue.get: no progress for 23.5 s; timed out after 25 s",
        steps=[],
        losses=[],
        config={},
        callback_result=None,
        wall_s=25.0,
        status="timeout",
        hang=dump(23.5),
    )
    m = Measured("workers=4", "loader", {})
    m.add(hung)
    assert m.errors[0].startswith("hung at train.py:40") and not m.steps_per_s
    import pitstop.profile.runs.runner as runner

    monkeypatch.setattr(runner, "run", lambda spec: hung)
    result, error = script.run_callback(["python", "train.py"], "loader", {})
    assert result is None and error.startswith("hung at train.py:40")


def _frame(module: str, function: str, user: bool = False, code: str = "", line: int = 1) -> dict:
    return {
        "file": f"/x/{module}.py",
        "line": line,
        "function": function,
        "module": module,
        "user": user,
        "code": code,
    }


def test_describe_kinds_of_collective_and_dataloader_waits():
    user = _frame("__main__", "<module>", user=True, code="dist.all_reduce(t)", line=40)
    collective = describe(
        [
            _frame("torch.distributed.distributed_c10d", "all_reduce"),
            _frame("torch.distributed.c10d_logger", "_exception_logger.<locals>.wrapper"),
            user,
        ]
    )
    assert collective["kind"] == "collective" and collective["where"].endswith("__main__.py:40")
    assert collective["call"] == collective["inner"] == "torch.distributed.distributed_c10d.all_reduce"
    native = describe([_frame("__main__", "<module>", user=True, code="work.wait()")])
    assert native["kind"] == "collective" and native["call"] == "work.wait"
    loader = describe(
        [
            _frame("threading", "Condition.wait"),
            _frame("multiprocessing.queues", "Queue.get"),
            _frame("torch.utils.data.dataloader", "_MultiProcessingDataLoaderIter._try_get_data"),
            _frame("torch.utils.data.dataloader", "_BaseDataLoaderIter.__next__"),
            _frame("pitstop.profile.capture.hooks", "_make_next.<locals>.__next__"),
            _frame("__main__", "<module>", user=True, code="for x, y in loader:"),
        ]
    )
    assert loader["kind"] == "dataloader"
    assert (
        loader["call"] == "torch.utils.data.dataloader._BaseDataLoaderIter.__next__"
    )  # pitstop's wrapper skipped


def test_a_frame_without_a_line_number_still_gives_a_stack():
    """Another thread's frame read between instructions can have ``f_lineno`` None. linecache raised a
    TypeError on it, which stopped the watchdog, so a hang that followed was never dumped."""
    code = test_a_frame_without_a_line_number_still_gives_a_stack.__code__
    caller = SimpleNamespace(f_code=code, f_lineno=None, f_globals={"__name__": __name__}, f_back=None)
    frames = frames_of(SimpleNamespace(f_code=code, f_lineno=None, f_globals=globals(), f_back=caller))
    assert [f["line"] for f in frames] == [code.co_firstlineno] * 2
    assert frames[0]["code"].startswith("def test_a_frame_without_a_line_number_still_gives_a_stack")
