"""``ddp_timers.TimerRounds``: rounds from the reducer's timers, and the rank's ``current`` around a backward."""

from __future__ import annotations

import json
import subprocess
import sys
import weakref
from pathlib import Path
from types import SimpleNamespace

from pitstop.profile.rank.ddp_timers import SAMPLE, WHAT, TimerRounds, recorded


class Rec:
    wall0 = 1000.0

    def __init__(self) -> None:
        self.steps = 0
        self.current = None
        self.beats: list[int] = []
        self.rounds: list[tuple] = []
        self.counted: dict[int, int] = {}  # rounds counted per step
        self.graph_reads: list[int] = []  # the steps whose forward read the reducer's graph facts

    def _step_totals(self, step: int) -> dict:
        tot = self.__dict__.setdefault("totals", {}).setdefault(step, {"ddp_rounds": 0})
        return tot

    def step(self) -> int:
        return self.steps

    def _beat(self, step: int) -> None:
        self.beats.append(step)

    def enter_round(self, loc, t) -> None:
        self.entered = getattr(self, "entered", 0) + 1
        self.current = (WHAT, loc, t)

    def add_round(self, *args) -> None:
        self.rounds.append(args)

    def _note_graph(self, ddp, facts) -> None:
        self.graph_reads.append(self.steps)


class DDP:
    """What the recorder reads of a DDP model: its logger's timers of the last iteration."""

    def __init__(self) -> None:
        self.ints: dict[str, int] = {"iteration": 0}
        self.reads = 0

        def read() -> SimpleNamespace:
            self.reads += 1
            return SimpleNamespace(ints_map=dict(self.ints))

        self.logger = SimpleNamespace(_get_ddp_logging_data=read)


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
    timers.backward_end(failed=False)
    assert rec.totals[0]["ddp_rounds"] == 1  # the backward that raised is not a round
    assert rec.entered == 2  # each all-reduce waited in counts among the collectives the rank entered


REDUCER = """
import json, tempfile, torch, torch.distributed as dist
from torch import nn
from pitstop.profile.rank import ddp_timers
dist.init_process_group("gloo", init_method=f"file://{tempfile.mkdtemp()}/s", rank=0, world_size=1)
m = nn.parallel.DistributedDataParallel(nn.Linear(4, 4))
seen = []
for i in range(1, 31):
    out = m(torch.randn(2, 4))
    if i == 1:
        assert ddp_timers.start(m)
    seen.append(m.logger._get_ddp_logging_data().ints_map.get("iteration"))
    out.sum().backward()
print(json.dumps(seen))
"""


def test_recorded_is_the_reducer_s_own_sampling(tmp_path):
    """Which iterations this torch's reducer records at ``SAMPLE``: each forward logs the one before it."""
    script = tmp_path / "reducer_sample.py"
    script.write_text(REDUCER)
    src = Path(__file__).resolve().parents[2] / "src"
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                       env={"PYTHONPATH": str(src), "PATH": "/usr/bin:/bin"})  # fmt: skip
    assert p.returncode == 0, p.stderr[-2000:]
    seen = json.loads(p.stdout.strip().splitlines()[-1])
    logged = sorted({it for it in seen if it})
    assert logged == [it for it in range(1, 30) if recorded(it)]
    assert SAMPLE > 1 and 11 not in logged


def test_timers_are_read_only_after_recorded_iterations_and_every_round_is_counted():
    rec, ddp = Rec(), DDP()
    timers, st = TimerRounds(rec), state(ddp)
    sampled = next(i for i in range(11, 100) if recorded(i))  # the first recorded after the first 10
    for it in range(1, sampled + 2):  # iteration `it`: its forward reads iteration it-1 where that was recorded
        rec.steps = it - 1
        if recorded(it - 1):
            ddp.ints = iteration(it - 1, fwd=it, first=it + 0.010, ready=it + 0.012, end=it + 0.015)
        timers.forward(ddp, st)
        timers.backward_begin("train.py:9", float(it))
        timers.backward_end(failed=False)
    assert ddp.reads == 1 + 10 + 1  # the first forward, iterations 1-10, then `sampled`, none between
    assert [r[0] for r in rec.rounds] == [*range(0, 10), sampled - 1]  # the step of each timed iteration
    assert all(rec.totals[s]["ddp_rounds"] == 1 for s in range(sampled + 1))
    assert st["pending"][0] == sampled + 1
    # the reducer's graph facts (static graph, unused parameters) are read with the timers, not every forward
    assert rec.graph_reads == [*range(0, 11), sampled]


def test_a_count_behind_the_reducer_catches_up_at_the_next_read():
    rec, ddp = Rec(), DDP()
    timers, st = TimerRounds(rec), state(ddp)
    ddp.ints = {"iteration": 7}  # the script ran syncing forwards before pitstop saw its DDP model
    timers.forward(ddp, st)
    assert st["pending"][0] == 8


def test_one_backward_through_two_synced_models_is_two_rounds():
    rec, g, d = Rec(), DDP(), DDP()
    timers = TimerRounds(rec)
    timers.forward(g, state(g))  # a GAN's generator, then its discriminator on the fake batch
    timers.forward(d, state(d))
    timers.backward_begin("train.py:9", 1.0)
    timers.backward_end(failed=False)
    assert rec.totals[0]["ddp_rounds"] == 2
    timers.backward_begin("train.py:12", 2.0)  # a backward with no syncing forward before it
    timers.backward_end(failed=False)
    assert rec.totals[0]["ddp_rounds"] == 2
