"""rank_stop: the ranks check in at the stop step through a real torch.distributed TCPStore."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import torch.distributed as dist

from pitstop.profile.rank import rank_stop


def _store(port: int = 0, master: bool = False) -> dist.TCPStore:
    return dist.TCPStore("127.0.0.1", port, is_master=master, timeout=timedelta(seconds=10),
                         wait_for_workers=False)  # fmt: skip


def test_every_rank_waits_for_the_last_one_then_all_stop():
    master = _store(master=True)
    got: dict[int, tuple[str | None, float]] = {}

    def rank(r: int, delay: float) -> None:
        time.sleep(delay)  # rank 1 reaches the stop step later: rank 0 must not leave before it
        got[r] = (rank_stop.agree("run", 8, 2, 10.0, _store(master.port)), time.monotonic())

    threads = [threading.Thread(target=rank, args=(r, 0.3 * r)) for r in (0, 1)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert got[0][0] is None and got[1][0] is None
    assert got[0][1] - t0 >= 0.3  # rank 0 left only once rank 1 had checked in


def test_a_rank_that_never_comes_leaves_the_others_stopping_with_the_reason():
    master = _store(master=True)
    why = rank_stop.agree("run2", 8, 2, 0.5, master)
    assert why == "the other ranks did not reach step 8 within 0.5 s"
    assert rank_stop.agree("run3", 8, 1, 0.5, master) is None  # one rank: nothing to agree on


def test_without_a_store_the_rank_says_why(monkeypatch):
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.delenv("MASTER_PORT", raising=False)
    assert "no torch.distributed store" in rank_stop.agree("run", 3, 2, 0.5)
