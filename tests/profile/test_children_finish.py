"""How the script's process ends its followed children (``Follower.on_done``), with plain processes as
children: no torch, no run."""

from __future__ import annotations

import json
import subprocess
import threading
import time

import pytest

from pitstop.profile.process import children
from pitstop.profile.process.children import Child, Follower
from pitstop.profile.rank.rank_worker import STATE, rank_dir


def _child(tmp_path, index: int) -> tuple[subprocess.Popen, Child]:
    proc = subprocess.Popen(["sleep", "60"])
    rank_dir(tmp_path, index).mkdir(parents=True)
    return proc, Child(index, proc.pid, daemon=True, name=f"c{index}", popen=proc)


def test_daemonic_child_that_never_steps_is_terminated_after_a_stopped_script(tmp_path, monkeypatch):
    monkeypatch.setattr(children, "GRACE_S", 0.3)
    proc, child = _child(tmp_path, 0)
    follower = Follower(inst=None, cfg={"out_dir": str(tmp_path)}, children=[child])
    try:
        follower.on_done("stopped")  # before: waited for the daemonic producer forever
        assert proc.wait(timeout=5) == -15  # SIGTERM, as Python's exit sends daemonic children
        assert (rank_dir(tmp_path, 0) / "exitcode").read_text() == "-15"
    finally:
        proc.kill()


def test_daemonic_child_is_waited_for_while_it_steps(tmp_path, monkeypatch):
    monkeypatch.setattr(children, "GRACE_S", 0.5)
    proc, child = _child(tmp_path, 0)
    follower = Follower(inst=None, cfg={"out_dir": str(tmp_path)}, children=[child])
    alive_at: list[int] = []
    state = rank_dir(tmp_path, 0) / STATE

    def steps() -> None:  # steps for ~1.2 s (more than GRACE_S), then ends by itself
        for step in range(1, 13):
            state.write_text(json.dumps({"step": step}))
            if proc.poll() is None:
                alive_at.append(step)
            time.sleep(0.1)
        proc.terminate()
        proc.wait()  # reaped here: gone (not a zombie) when the follower looks

    thread = threading.Thread(target=steps)
    try:
        thread.start()
        follower.on_done("stopped")
        thread.join()
        assert alive_at == list(range(1, 13))  # not cut off after GRACE_S while its step moved
    finally:
        proc.kill()
        thread.join()


def _stops(i: int) -> int:
    from pitstop.profile.process.child_worker import PoolStop

    raise PoolStop("measured 4 steps")


def test_a_pool_workers_stop_is_not_caught_by_the_scripts_except_exception():
    from multiprocessing.pool import ThreadPool  # the same result classes as a process Pool

    from pitstop.patching import Patches
    from pitstop.profile.capture.hooks import StopProfiling

    patches = Patches()
    children._stop_through_pool_results(patches)
    reads = (
        lambda pool: pool.map(_stops, range(2)),
        lambda pool: pool.apply(_stops, (0,)),
        lambda pool: list(pool.imap(_stops, range(2))),
        lambda pool: list(pool.imap_unordered(_stops, range(2))),
    )
    try:
        with ThreadPool(1) as pool:
            for read in reads:
                with pytest.raises(StopProfiling) as info:
                    try:
                        read(pool)
                    except Exception:  # the script's own handler around the map
                        pytest.fail("the stop was caught as an Exception")
                assert type(info.value) is StopProfiling
            with pytest.raises(ZeroDivisionError):  # the script's own errors are untouched
                pool.apply(divmod, (1, 0))
    finally:
        patches.undo()
