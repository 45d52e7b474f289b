"""Hangs and stalls end to end: real child processes that block, lose a producer thread, lose a DataLoader
worker, or pause to "save a checkpoint"; each must give the right finding at the right file:line.

The hang floor is lowered with PITSTOP_HANG_FLOOR_S so the watchdog sees a hang in a second; the tests
that need the run stopped press "Ctrl-C" (SIGINT to this process, which the runner turns into a stop)
as soon as the watchdog has written its hang dump, so none waits for a fixed timeout but the first.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import textwrap
import threading
from pathlib import Path

import jsonschema
import pytest

from pitstop.findings import Severity
from pitstop.profile.present.render import html_blocks
from pitstop.profile.runs.runner import RunSpec, run
from pitstop.report.html import render_html
from pitstop.report.jsonfmt import load_schema

pytestmark = pytest.mark.slow

FAST_HANG = {"PITSTOP_HANG_FLOOR_S": "1"}

TRAIN_HEAD = """
import torch
torch.set_num_threads(1)
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
def train_step(x):
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


def write(tmp_path: Path, name: str, body: str) -> Path:
    p = tmp_path / name
    p.write_text(TRAIN_HEAD + textwrap.dedent(body))
    return p


def line_of(path: Path, marker: str) -> int:
    return next(i for i, text in enumerate(path.read_text().splitlines(), 1) if marker in text)


def spec(path: Path, **kw) -> RunSpec:
    kw.setdefault("quiet", True)
    kw.setdefault("probes", False)
    return RunSpec(command=[sys.executable, str(path)], **kw)


@contextlib.contextmanager
def ctrl_c_once_hung(out_dir: Path):
    """Interrupt the runner (as Ctrl-C does) once the child's watchdog has dumped a hang after a step
    (with a 1 s floor, slow imports before the first step can give a dump that recovers)."""
    done = threading.Event()

    def watch() -> None:
        while not done.wait(0.05):
            with contextlib.suppress(OSError, ValueError):
                hangs = json.loads((out_dir / "watchdog.json").read_text()).get("hangs") or []
                if any(h.get("last_step") for h in hangs):
                    os.kill(os.getpid(), signal.SIGINT)
                    return

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    try:
        yield
    finally:
        done.set()
        t.join()


def test_time_sleep_hang_is_located_at_the_timeout(tmp_path):
    """The issue's case: trains 8 steps, then blocks; --full --timeout stops it. The stacks are taken
    before SIGINT, the finding names the line and the call, and the run is not called healthy."""
    path = write(
        tmp_path,
        "sleeper.py",
        """
        import time
        for step in range(1000):
            train_step(torch.randn(4, 8))
            if step == 7:
                time.sleep(600)  # HANG
        """,
    )
    # generous: the child imports torch first, which takes seconds on a loaded machine
    r = run(spec(path, full=True, timeout=30), out_dir=tmp_path / "run")
    assert r.status == "timeout" and not r.ok
    where = f"sleeper.py:{line_of(path, '# HANG')}"
    assert r.hang is not None and r.hang["main"]["where"].endswith(where)
    assert r.error.startswith(f"hung at {r.hang['main']['where']} in time.sleep")
    report = r.report()
    f = report.by_id("profile.hang")
    assert f is not None and f.severity is Severity.ERROR and f.location.endswith(where)
    assert f.data["kind"] == "sleep" and f.data["call"] == "time.sleep"
    assert f.data["last_step"]["index"] == 7  # 8 steps done, counted from 0
    assert "8 steps completed" in f.evidence
    assert report.by_id("summary.healthy") is None
    main = next(t for t in f.data["threads"] if t["main"])
    assert any(fr["user"] and fr["file"].endswith("sleeper.py") for fr in main["frames"])
    d = report.to_dict()
    jsonschema.validate(d, load_schema())
    assert any(x["id"] == "profile.hang" and x["data"]["threads"] for x in d["findings"])
    page = render_html(report, html_blocks(report))
    assert "Stacks for profile.hang" in page and "time.sleep(600)" in page
    assert "&lt;module&gt;" in page and "<module>" not in page


def test_queue_get_from_a_dead_producer_thread(tmp_path):
    path = write(
        tmp_path,
        "producer.py",
        """
        import queue
        import threading
        q = queue.Queue()
        def produce():
            for _ in range(6):
                q.put(torch.randn(4, 8))
            raise ValueError("lost the data source")  # DIES
        threading.Thread(target=produce, name="producer", daemon=True).start()
        for step in range(100):
            x = q.get()  # BLOCKS
            train_step(x)
        """,
    )
    out = tmp_path / "run"
    with ctrl_c_once_hung(out):
        r = run(spec(path, full=True, timeout=120, env=FAST_HANG), out_dir=out)
    assert r.status == "interrupted"
    f = r.report().by_id("profile.hang")
    assert f is not None, (r.error, r.data.get("watchdog", {}).keys())
    assert f.location.endswith(f"producer.py:{line_of(path, '# BLOCKS')}")
    assert f.data["kind"] == "queue" and f.data["call"] == "queue.Queue.get"
    dead = f.data["dead_threads"]
    assert dead and dead[0]["name"] == "producer" and "ValueError: lost the data source" in dead[0]["error"]
    assert dead[0]["where"].endswith(f"producer.py:{line_of(path, '# DIES')}")
    assert "thread 'producer' died with ValueError" in f.evidence


def test_dataloader_worker_killed_mid_epoch(tmp_path):
    path = write(
        tmp_path,
        "killed.py",
        """
        import os
        import signal
        from torch.utils.data import DataLoader, Dataset, get_worker_info
        class Data(Dataset):
            def __len__(self):
                return 400
            def __getitem__(self, i):
                if i == 120 and get_worker_info() is not None:
                    os.kill(os.getpid(), signal.SIGKILL)
                return torch.randn(8)
        loader = DataLoader(Data(), batch_size=4, num_workers=2)
        for x in loader:  # LOOP
            train_step(x)
        """,
    )
    r = run(spec(path, steps=500, warmup=1, env=FAST_HANG), out_dir=tmp_path / "run")
    assert r.status == "error" and r.hang is None
    report = r.report()
    f = report.by_id("dataloader.worker_died")
    assert f is not None, (r.error, [x.id for x in report.findings])
    assert f.severity is Severity.ERROR
    assert f.location.endswith(f"killed.py:{line_of(path, '# LOOP')}")
    assert [w["exitcode"] for w in f.data["dead_workers"]] == [-9]
    assert "killed by SIGKILL" in f.evidence and "of 100 batches of the epoch" in f.evidence
    assert report.by_id("profile.hang") is None and report.by_id("summary.healthy") is None


def test_periodic_checkpoint_save_is_a_stall_not_a_hang(tmp_path):
    path = write(
        tmp_path,
        "ckpt.py",
        """
        import time
        def save_checkpoint(path):
            torch.save(model.state_dict(), path)
            time.sleep(3)  # SAVE
        for step in range(1000):
            train_step(torch.randn(4, 8))
            if step and step % 20 == 0:
                save_checkpoint("ckpt.pt")
        """,
    )
    r = run(spec(path, steps=40, warmup=2, cwd=str(tmp_path)), out_dir=tmp_path / "run")
    assert r.status == "stopped" and r.hang is None
    report = r.report()
    f = report.by_id("profile.stall")
    assert f is not None, [x.id for x in report.findings]
    assert f.data["steps"] == [20, 40] and "every 20 steps" in f.evidence
    assert f.location.endswith(f"ckpt.py:{line_of(path, '# SAVE')}")
    assert "save_checkpoint" in "".join(fr["function"] for s in f.data["samples"] for fr in s["frames"])
    assert f.severity is Severity.WARN and f.est_saving_s > 0
    assert report.by_id("profile.hang") is None and report.by_id("summary.healthy") is None


def test_all_reduce_that_another_rank_never_joins(tmp_path):
    """A gloo group of two: the script's peer process joins, then never reaches the all_reduce."""
    path = write(
        tmp_path,
        "collective.py",
        """
        import socket
        import subprocess
        import sys
        import time
        import torch.distributed as dist
        if len(sys.argv) > 1:  # the peer, rank 1
            dist.init_process_group("gloo", init_method=sys.argv[1], rank=1, world_size=2)
            time.sleep(600)
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        url = f"tcp://127.0.0.1:{s.getsockname()[1]}"
        s.close()
        peer = subprocess.Popen([sys.executable, __file__, url])
        dist.init_process_group("gloo", init_method=url, rank=0, world_size=2)
        for step in range(100):
            train_step(torch.randn(4, 8))
            if step == 3:
                dist.all_reduce(torch.ones(1))  # BLOCKS
        """,
    )
    out = tmp_path / "run"
    with ctrl_c_once_hung(out):
        r = run(spec(path, full=True, timeout=120, env=FAST_HANG), out_dir=out)
    assert r.status == "interrupted"
    f = r.report().by_id("profile.hang")
    assert f is not None, r.error
    assert f.location.endswith(f"collective.py:{line_of(path, '# BLOCKS')}")
    assert (
        f.data["kind"] == "collective" and f.data["call"] == "torch.distributed.distributed_c10d.all_reduce"
    )
