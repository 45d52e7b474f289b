"""``ddp_timers.TimerRounds``: rounds from the reducer's timers, and the rank's ``current`` around a backward."""

from __future__ import annotations

import weakref
from types import SimpleNamespace

from pitstop.profile.ddp_timers import WHAT, TimerRounds


class Rec:
    wall0 = 1000.0

    def __init__(self) -> None:
        self.steps = 0
        self.current = None
        self.beats: list[int] = []
        self.rounds: list[tuple] = []

    def step(self) -> int:
        return self.steps

    def _beat(self, step: int) -> None:
        self.beats.append(step)

    def add_round(self, *args) -> None:
        self.rounds.append(args)


class DDP:
    """What the recorder reads of a DDP model: its logger's timers of the last iteration."""

    def __init__(self) -> None:
        self.ints: dict[str, int] = {"iteration": 0}
        self.logger = SimpleNamespace(_get_ddp_logging_data=lambda: SimpleNamespace(ints_map=dict(self.ints)))


def ns(s: float) -> int:
    return round((Rec.wall0 + s) * 1e9)


def iteration(n: int, fwd: float, first: float, ready: float, end: float) -> dict[str, int]:
    return {"iteration": n, "forward_compute_time_start": ns(fwd), "backward_comm_time_start": ns(first),
            "backward_compute_time_end": ns(ready), "backward_comm_time_end": ns(end)}  # fmt: skip


def state(ddp: DDP) -> dict:
    return {"ref": weakref.ref(ddp), "facts": {"param_bytes": 4096}}


def test_each_iteration_is_read_at_the_next_forward_with_the_step_of_its_own():
    rec, ddp = Rec(), DDP()
    timers, st = TimerRounds(rec), state(ddp)
    timers.forward(ddp, st)  # forward of iteration 1: nothing timed yet
    assert rec.rounds == [] and st["pending"] == (1, 0, 4096)
    rec.steps = 1  # the step closed before the next forward
    ddp.ints = iteration(1, fwd=0.0, first=0.010, ready=0.012, end=0.015)
    timers.forward(ddp, st)
    ((step, first, ready, end, nbytes, _loc),) = rec.rounds
    assert (step, nbytes) == (0, 4096)
    assert abs(first - 0.010) < 1e-6 and abs(ready - 0.012) < 1e-6 and abs(end - 0.015) < 1e-6


def rounds_after(data: dict[str, int]) -> list[tuple]:
    """The rounds a recorder takes from ``data``, read at the forward after iteration 1's."""
    rec, ddp = Rec(), DDP()
    timers, st = TimerRounds(rec), state(ddp)
    timers.forward(ddp, st)
    ddp.ints = data
    timers.forward(ddp, st)
    return rec.rounds


def test_an_iteration_without_a_backward_gives_no_round():
    # the timers still hold an older all-reduce, before this iteration's forward began
    assert rounds_after(iteration(1, fwd=0.020, first=0.010, ready=0.012, end=0.015)) == []


def test_the_ready_moment_is_kept_inside_the_all_reduce():
    ((_step, _first, ready, end, _nbytes, _loc),) = rounds_after(
        iteration(1, fwd=0.0, first=0.010, ready=0.030, end=0.015)
    )
    assert ready == end


def test_backward_after_a_syncing_forward_is_the_current_collective_until_it_returns():
    rec, ddp = Rec(), DDP()
    timers, st = TimerRounds(rec), state(ddp)
    timers.backward_begin("train.py:9", 5.0)
    assert rec.current is None  # no syncing forward before it: no all-reduce to wait in
    timers.forward(ddp, st)
    timers.backward_begin("train.py:9", 5.0)
    assert rec.current == (WHAT, "train.py:9", 5.0) and rec.beats == [0]
    timers.backward_end(failed=False)
    assert rec.current is None
    timers.forward(ddp, st)
    timers.backward_begin("train.py:9", 6.0)
    timers.backward_end(failed=True)  # a peer gone: the rank stays reported as waiting there
    assert rec.current == (WHAT, "train.py:9", 6.0)
