"""The periodic flush: step records appended to the steps log once each, read back as one list."""

from __future__ import annotations

import json
import math

import numpy as np

from pitstop.profile.capture.hooks import Config, Instrumentation
from pitstop.profile.record.jsonfile import write_json_atomic
from pitstop.profile.record.timeline import STEPS_LOG, StepsLog, steps_from_log
from pitstop.profile.runs.result import read_measurements
from pitstop.profile.runs.runner import _steps_so_far


def _rec(i: int, **extra: object) -> dict[str, object]:
    return {"index": i, "total_s": 0.01 * (i + 1), "warmup": i < 2, **extra}


def _lines(path):
    """The records in the log (its first line is its generation)."""
    first, *rest = path.read_text().splitlines()
    assert "generation" in json.loads(first)
    return [json.loads(line) for line in rest]


def test_steps_log_appends_each_record_once(tmp_path):
    log, records = StepsLog(tmp_path / STEPS_LOG), []
    assert log.write(records) == 0 and _lines(log.path) == []
    for i in range(5):
        records.append(_rec(i))
        assert log.write(records) == i + 1
        assert _lines(log.path) == records
    size = log.path.stat().st_size
    assert log.write(records) == 5 and log.path.stat().st_size == size  # nothing new: nothing written


def test_steps_log_starts_afresh_when_the_records_were_dropped(tmp_path):
    log, records = StepsLog(tmp_path / STEPS_LOG), [_rec(0), _rec(1), _rec(2)]
    log.write(records)
    records.clear()  # micro-steps dropped, then as many new steps as before and more
    records.extend([_rec(0, eval=True), _rec(1, eval=True), _rec(2), _rec(3)])
    assert log.write(records) == 4 and _lines(log.path) == records
    records.clear()
    assert log.write(records) == 0 and _lines(log.path) == []


def test_a_stale_log_of_an_earlier_run_is_replaced(tmp_path):
    (tmp_path / STEPS_LOG).write_text(json.dumps(_rec(7)) + "\n")
    log = StepsLog(tmp_path / STEPS_LOG)
    assert log.write([_rec(0)]) == 1 and _lines(log.path) == [_rec(0)]


def test_steps_log_writes_nan_and_numpy_values_as_every_record_is_written(tmp_path):
    log = StepsLog(tmp_path / STEPS_LOG)
    log.write([_rec(0, h2d_gpu_s=math.nan), _rec(1, syncs=np.int64(3))])
    assert _lines(log.path) == [_rec(0, h2d_gpu_s=None), _rec(1, syncs=3)]


def test_only_the_counted_lines_of_the_same_generation_are_read_back(tmp_path):
    # a crash after appending and before the measurements file named the new lines, or mid-line
    head = json.dumps({"generation": 2}) + "\n"
    lines = "".join(json.dumps(_rec(i)) + "\n" for i in range(3))
    (tmp_path / STEPS_LOG).write_text(head + lines + '{"index": 3, "to')
    running = {"status": "running", "steps_log": STEPS_LOG, "steps_count": 2, "steps_generation": 2}
    assert steps_from_log(running, tmp_path)["steps"] == [_rec(0), _rec(1)]
    # written afresh (the records were dropped) after the record was: none of it is the record's
    assert steps_from_log({**running, "steps_generation": 1}, tmp_path)["steps"] == []
    final = {"status": "completed", "steps": [_rec(0)], "steps_log": STEPS_LOG, "steps_count": 3}
    assert steps_from_log(final, tmp_path)["steps"] == [_rec(0)]  # the final record holds its own steps
    assert steps_from_log({"steps_log": "missing.jsonl", "steps_count": 2}, tmp_path)["steps"] == []


def test_a_flush_of_a_run_cut_short_is_collected_with_its_steps(tmp_path):
    inst = Instrumentation(Config(warmup=1, steps=10, full=True, out_dir=tmp_path))
    inst.flush_path = tmp_path / "measurements.json"
    inst.records.extend(_rec(i, warmup=i < 1, start_s=0.01 * i) for i in range(4))
    inst.flush("running")
    inst.records.append(_rec(4, warmup=False, start_s=0.04))
    inst.flush("running")
    flushed = json.loads(inst.flush_path.read_text())
    assert "steps" not in flushed and flushed["steps_count"] == 5
    assert _steps_so_far(inst.flush_path) == 5
    from pitstop.profile.runs.runner import RunSpec

    res = read_measurements(RunSpec(command=["python", "x.py"]), inst.flush_path, -9, None, 1.0)
    assert res.status == "killed" and [s.index for s in res.warmup_steps + res.steps] == [0, 1, 2, 3, 4]


def test_write_json_atomic_writes_infinities_as_null(tmp_path):
    path = tmp_path / "m.json"
    write_json_atomic(path, {"status": "running", "x": math.inf})
    assert json.loads(path.read_text()) == {"status": "running", "x": None}


def test_the_periodic_flush_stretches_where_a_flush_is_slow(tmp_path, monkeypatch):
    from pitstop.profile.capture import hooks

    fake = {"now": 0.0, "flushes": []}
    monkeypatch.setattr(hooks, "clock", lambda: fake["now"])
    monkeypatch.setattr(hooks, "FLUSH_EVERY_S", 1.0)
    monkeypatch.setattr(hooks, "FLUSH_SHARE", 0.001)

    def slow_flush(self, status, **extra):  # a flush that takes 4 ms
        fake["flushes"].append(fake["now"])
        fake["now"] += 0.004

    monkeypatch.setattr(Instrumentation, "flush", slow_flush)
    inst = Instrumentation(Config(warmup=1, steps=10**6, full=True, out_dir=tmp_path))
    inst._begin(0.0)
    for i in range(1, 2001):  # 20 s of 10 ms steps
        fake["now"] = max(fake["now"], 0.01 * i)
        inst.close_step(fake["now"])
    gaps = np.diff(fake["flushes"])
    # the first flush after 1 s; then 4 ms a flush is 0.1% of 4 s between flushes, not 0.4% of 1 s
    assert 0.99 < fake["flushes"][0] < 1.03
    assert len(gaps) >= 3 and all(3.99 < g < 4.03 for g in gaps)


def test_the_flush_interval_stays_fixed_where_the_environment_sets_it(tmp_path, monkeypatch):
    from pitstop.profile.capture import hooks

    fake = {"now": 0.0, "flushes": []}
    monkeypatch.setattr(hooks, "clock", lambda: fake["now"])
    monkeypatch.setattr(hooks, "FLUSH_EVERY_S", 0.5)
    monkeypatch.setattr(hooks, "FLUSH_SHARE", None)  # PITSTOP_PROFILE_FLUSH_S given

    def slow_flush(self, status, **extra):
        fake["flushes"].append(fake["now"])
        fake["now"] += 0.004

    monkeypatch.setattr(Instrumentation, "flush", slow_flush)
    inst = Instrumentation(Config(warmup=1, steps=10**6, full=True, out_dir=tmp_path))
    inst._begin(0.0)
    for i in range(1, 501):
        fake["now"] = max(fake["now"], 0.01 * i)
        inst.close_step(fake["now"])
    assert all(0.49 < g < 0.53 for g in np.diff(fake["flushes"]))


def test_a_periodic_flush_that_cannot_write_never_reaches_the_script(tmp_path, monkeypatch):
    from pitstop.profile.capture import hooks

    fake = {"now": 0.0, "tries": []}
    monkeypatch.setattr(hooks, "clock", lambda: fake["now"])
    monkeypatch.setattr(hooks, "FLUSH_EVERY_S", 1.0)
    monkeypatch.setattr(hooks, "FLUSH_SHARE", None)
    inst = Instrumentation(Config(warmup=1, steps=10**6, full=True, out_dir=tmp_path))
    inst.flush_path = tmp_path / "gone" / "measurements.json"  # the output folder removed mid-run
    real_flush = Instrumentation.flush

    def counted(self, status, **extra):
        fake["tries"].append(fake["now"])
        return real_flush(self, status, **extra)

    monkeypatch.setattr(Instrumentation, "flush", counted)
    inst._begin(0.0)
    for i in range(1, 1001):  # 10 s of 10 ms steps: every close_step returns
        fake["now"] = 0.01 * i
        inst.close_step(fake["now"])
    assert len(inst.records) == 1000
    assert inst.flush_error is not None and "FileNotFoundError" in inst.flush_error
    # tried after 1 s, then 2 s and 4 s apart (backing off), not every second
    assert np.allclose(np.diff(fake["tries"]), [2.0, 4.0], atol=0.02)
    (tmp_path / "gone").mkdir()  # the folder is back: the next try writes, the error stays on record
    for i in range(1001, 1801):
        fake["now"] = 0.01 * i
        inst.close_step(fake["now"])
    flushed = json.loads(inst.flush_path.read_text())
    assert flushed["status"] == "running" and "FileNotFoundError" in flushed["flush_error"]
    # the report says so: one info finding with the error, none where every write went through
    from pitstop.profile.analyze.rules_progress import progress_rules

    (f,) = [f for f in progress_rules(flushed) if f.id == "profile.record_write_failed"]
    assert f.severity.value == "info" and "FileNotFoundError" in f.evidence
    clean = progress_rules({**flushed, "flush_error": None})
    assert "profile.record_write_failed" not in [f.id for f in clean]
