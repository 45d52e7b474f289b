"""DDP's gradient all-reduce timed by the reducer's own timers: no Python on the all-reduce path.

A Python comm hook (``pitstop.profile.rank.comm_hook``) costs every gradient bucket a Python call where DDP's
reducer runs none, a Python callback that must take the GIL on the backend's thread, and an extra pass
over the gradients (with a hook the reducer copies them into the bucket, then the hook divides). On a
2-rank gloo job with a 8 ms step that was about 0.5 ms of CPU per step and rank, over 10% of the step.
So where the script registers no hook of its own and the model is on the CPU, the recorder registers none
either: the reducer records its timers on its first 10 iterations and then every ``SAMPLE``-th
(``_set_ddp_runtime_logging_sample_rate``; 100 by default) and ``TimerRounds`` reads them at the next
forward that syncs (``_get_ddp_logging_data``): the wall-clock time of the first bucket's launch, the
moment every gradient was ready and the end of the all-reduce (after the reducer waited for every
bucket). The last iteration is read at the end. Recording and reading the timers every iteration cost
each rank about 0.1 ms of CPU a step in a 2-rank job on 2 cores (benchmarks/results/profile_ranks_insitu.md),
so the rounds are timed on that sample: every round is counted (``ddp_rounds``), the timed ones also add
their times (``ddp_timed_rounds``), and a rank's figures per step are the timed rounds' mean times
the rounds per step. Not on CUDA: reading the reducer's CUDA timers synchronizes the device.

What the hook gives per bucket, the timers give per backward: the all-reduce time is the span from the
first launch to the end (the hook's figure is the union of the bucket intervals), the exposed part is the
end minus the moment the last bucket was ready, as with the hook. The rank's ``current`` collective (read
when a peer dies) is the backward that follows a syncing forward, from its start.
"""

from __future__ import annotations

import contextlib
from typing import Any

WHAT = "DDP gradient all-reduce"
SAMPLE = 8  # after the first 10 iterations, the reducer records every SAMPLE-th


def start(ddp: Any) -> bool:
    """Have the reducer record its timers on the sample; False where this torch cannot."""
    try:
        ddp.reducer._set_ddp_runtime_logging_sample_rate(SAMPLE)
    except Exception:
        return False
    return True


def recorded(iteration: int) -> bool:
    """Whether the reducer records the timers of ``iteration`` (counted from 1), as its
    ``should_collect_runtime_stats`` decides."""
    return 0 < iteration <= 10 or iteration % SAMPLE == 0


class TimerRounds:
    """The rounds of the DDP models timed by their reducers, for one ``CommRecorder``."""

    def __init__(self, rec: Any) -> None:
        self.rec = rec
        self.armed = 0  # syncing forwards since the last backward: it all-reduces each one's gradients
        self.rounds = 0  # the rounds of the backward running now
        self.in_backward = False
        self.location: str | None = None
        self.step = 0  # the step of the round the next backward runs

    def forward(self, ddp: Any, st: dict[str, Any]) -> None:
        """At a forward that syncs (after DDP logged the timers of the iteration before it, where it records
        that one): that iteration's round, then this one noted for the next read."""
        pending = st.get("pending")
        nxt = pending[0] + 1 if pending else 1
        if pending is None or recorded(pending[0]):
            self.rec._note_graph(ddp, st["facts"])  # the reducer's record of the last backward, sampled too
            data = _data(ddp)
            if data is None:
                return
            self._round(st, data)
            nxt = max(nxt, data.get("iteration", 0) + 1)  # the reducer's count, where ours fell behind
        self.step = self.rec.step()
        st["pending"] = (nxt, self.step, st["facts"]["param_bytes"])
        self.armed += 1

    def finish(self, states: Any) -> None:
        """The last iteration of each model: its timers are read by the next forward, which never came."""
        for st in states:
            ddp = st["ref"]() if st.get("pending") and recorded(st["pending"][0]) else None
            if ddp is None:
                continue
            with contextlib.suppress(Exception):
                ddp.logger.set_runtime_stats_and_log()
            data = _data(ddp)
            if data is not None:
                self._round(st, data)

    def backward_begin(self, location: str | None, now: float) -> None:
        if not self.armed or self.in_backward:
            return
        self.rounds, self.armed, self.in_backward, self.location = self.armed, 0, True, location
        rec = self.rec
        rec._beat(rec.step())
        rec.enter_round(location, now)

    def backward_end(self, failed: bool) -> None:
        """A backward that raised (a peer gone) keeps the all-reduce it was blocked in as ``current``."""
        if not self.in_backward:
            return
        self.in_backward = False
        if not failed:
            self.rec._step_totals(self.step)["ddp_rounds"] += self.rounds  # timed or not
            if self.rec.current is not None and self.rec.current[0] == WHAT:
                self.rec.current = None

    def _round(self, st: dict[str, Any], data: dict[str, int]) -> None:
        pending, st["pending"] = st.get("pending"), None
        if pending is None or data.get("iteration") != pending[0]:
            return
        fwd = data.get("forward_compute_time_start", 0)
        first, end = data.get("backward_comm_time_start", 0), data.get("backward_comm_time_end", 0)
        if not (fwd and first >= fwd and end >= first):
            return  # no all-reduce in that iteration (no backward after the forward)
        ready = min(max(data.get("backward_compute_time_end", 0), first), end)
        rec = self.rec

        def clock(ns: int) -> float:  # the timers' wall clock -> the recorder's perf_counter
            return ns / 1e9 - rec.wall0

        rec.add_round(pending[1], clock(first), clock(ready), clock(end), pending[2], self.location)


def _data(ddp: Any) -> dict[str, int] | None:
    try:
        return ddp.logger._get_ddp_logging_data().ints_map
    except Exception:
        return None
