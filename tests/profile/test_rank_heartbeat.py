"""A rank's heartbeat: the step of its last collective, in a file mapped into memory, read if it dies."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from pitstop.profile.rank import rank_worker as rw
from pitstop.profile.runs import ranks


def _state(d: Path, step: int) -> None:
    d.mkdir(parents=True, exist_ok=True)
    (d / rw.STATE).write_text(
        json.dumps({"rank": 0, "pid": 0, "host": None, "step": step, "status": "running"})
    )


def test_heartbeat_of_a_killed_rank_is_read_with_its_last_step(tmp_path):
    d = rw.rank_dir(tmp_path, 0)
    _state(d, 3)  # the watchdog's last state lags the heartbeat
    code = textwrap.dedent(f"""
        import os, signal
        from pathlib import Path
        from pitstop.profile.rank.rank_worker import RankWorker, HEARTBEAT, _heartbeat_map, identity
        w = RankWorker(identity({{}}), Path({str(d)!r}))
        w._beaten, w._beat_map = -1, _heartbeat_map(w.out / HEARTBEAT)
        for step in (5, 5, 7):
            w._beat(step)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    p = subprocess.run([sys.executable, "-c", code], env={**os.environ}, capture_output=True, text=True)
    assert p.returncode == -signal.SIGKILL, p.stderr
    assert (d / rw.HEARTBEAT).read_bytes() == b"%12d\n" % 7
    st = ranks.read_states(tmp_path)[0]
    assert st["collective_step"] == 7 and st["step"] == 7


def test_heartbeat_before_any_collective_is_not_a_step(tmp_path):
    d = rw.rank_dir(tmp_path, 0)
    _state(d, 2)
    (d / rw.HEARTBEAT).write_bytes(b"%12d\n" % 40)  # a previous run's, in the same folder
    old = rw._heartbeat_map(d / rw.HEARTBEAT)
    beat = rw._heartbeat_map(d / rw.HEARTBEAT)  # a rank restarted while the old mapping lives on
    assert beat is not None and old is not None
    st = ranks.read_states(tmp_path)[0]
    assert "collective_step" not in st and st["step"] == 2
    old[:] = b"%12d\n" % 9  # the old mapping's file was replaced, not truncated: no SIGBUS, not read
    assert "collective_step" not in ranks.read_states(tmp_path)[0]
    assert [p.name for p in d.iterdir() if p.name.startswith(".")] == []


def test_heartbeat_where_the_file_cannot_be_made_is_skipped(tmp_path):
    assert rw._heartbeat_map(tmp_path / "missing-dir" / rw.HEARTBEAT) is None
    w = rw.RankWorker(rw.identity({}), tmp_path)
    w._beaten, w._beat_map = -1, None
    w._beat(4)  # no file, no error: the rank trains on
    assert w._beaten == 4


def test_heartbeat_that_cannot_be_mapped_leaves_no_earlier_run_s_beat(tmp_path, monkeypatch):
    import mmap

    d = rw.rank_dir(tmp_path, 0)
    _state(d, 2)
    (d / rw.HEARTBEAT).write_bytes(b"%12d\n" % 40)  # a previous run's, in a reused --out-dir

    def refuse(*a, **kw):
        raise OSError(19, "No such device")  # a filesystem without shared writable mappings

    monkeypatch.setattr(mmap, "mmap", refuse)
    assert rw._heartbeat_map(d / rw.HEARTBEAT) is None
    assert sorted(p.name for p in d.iterdir()) == [rw.STATE]
    st = ranks.read_states(tmp_path)[0]
    assert "collective_step" not in st and st["step"] == 2
