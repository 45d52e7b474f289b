"""Device time per phase on CUDA: events at the step's phase boundaries, read without added syncs.

The hooks call ``DeviceTimer.mark(phase, host_time)`` where a phase ends (data handed over, forward
start and end, backward end, optimizer end) and ``close_step`` at the step boundary. Each mark records a
CUDA event on the current stream and notes the host clock; nothing waits. Every ``read_every`` steps
the events of steps whose last event has completed (``Event.query()``, no sync) are read and released;
``finish`` (after the run's final ``torch.cuda.synchronize``) reads the rest and anchors the device
times on the host clock: an event recorded on an idle device runs as it is recorded, so its host time is
its device time, and every other event sits ``elapsed_time`` before it.

With the two clocks aligned, ``step_device`` turns one step's marks into device time per phase (the
time the stream took from one mark to the next) and ``attribute`` splits the step's wall time into
device busy and device idle, the idle going to data wait, launch gaps, host syncs and the rest. A step
whose device work fills its wall time is compute-bound: the host's time blocked in ``.item()`` there
was the device computing, and the findings must not claim it (``pitstop.profile.analyze.gpu_rules``).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

READ_EVERY = 16
# the segment ending at this mark belongs to this phase
SEGMENT_PHASE = {
    "data_ready": "data",
    "fwd_start": "pre",
    "fwd_end": "forward",
    "bwd_end": "backward",
    "opt_end": "optimizer",
    "step_end": "post",
}
COMPUTE_PHASES = ("forward", "backward", "optimizer")


@dataclass
class DeviceTimer:
    """Marks per step -> device times. ``event_factory`` makes an object with ``record()``, ``query()``
    and ``elapsed_time(other) -> ms`` (``torch.cuda.Event(enable_timing=True)``; tests pass fakes)."""

    event_factory: Callable[[], Any] | None = None
    synchronize: Callable[[], None] | None = None
    clock: Callable[[], float] = time.perf_counter
    read_every: int = READ_EVERY
    enabled: bool = False
    error: str | None = None
    _ref: Any = None
    _cur: list[tuple[str, float, Any]] = field(default_factory=list)
    _pending: list[tuple[int, list[tuple[str, float, Any]]]] = field(default_factory=list)
    # step index -> [(mark, host time, ms after the reference event)]
    read: dict[int, list[tuple[str, float, float]]] = field(default_factory=dict)
    offset_s: float | None = None  # host time of the reference event, once anchored

    def enable_cuda(self) -> None:
        import torch

        self.event_factory = lambda: torch.cuda.Event(enable_timing=True)
        self.synchronize = torch.cuda.synchronize
        self.enabled = True

    def _event(self) -> Any:
        assert self.event_factory is not None
        ev = self.event_factory()
        ev.record()
        if self._ref is None:
            self._ref = ev
        return ev

    def mark(self, name: str, host_t: float) -> None:
        if not self.enabled or not self._cur:  # a step's marks start at its boundary
            return
        self._cur.append((name, host_t, self._event()))

    def close_step(self, index: int, host_t: float, device: Any = None) -> None:
        """The step ``index`` ended at ``host_t``; the same event opens the next step. Timing starts at the
        first step boundary where the script trains on CUDA."""
        if not self.enabled:
            if self.error or getattr(device, "type", None) != "cuda":  # every step of a CPU run: kept short
                return
            try:
                self.enable_cuda()
            except Exception as e:
                self.error = f"CUDA events unavailable: {type(e).__name__}: {e}"
                return
        try:
            ev = self._event()
            if self._cur:
                self._pending.append((index, [*self._cur, ("step_end", host_t, ev)]))
            self._cur = [("step_start", host_t, ev)]
            if len(self._pending) >= self.read_every:
                self.poll()
        except Exception as e:  # never break the user's step over timing
            self.enabled, self.error = False, f"CUDA event failed: {type(e).__name__}: {e}"

    def poll(self) -> None:
        """Read the steps whose events have all completed (no sync), oldest first."""
        while self._pending:
            index, marks = self._pending[0]
            if not marks[-1][2].query():
                return
            self._read(index, marks)
            self._pending.pop(0)

    def _read(self, index: int, marks: list[tuple[str, float, Any]]) -> None:
        self.read[index] = [(n, h, float(self._ref.elapsed_time(ev))) for n, h, ev in marks]

    def finish(self) -> None:
        """After the run: wait for the device, read every step, anchor device times on the host clock."""
        if not self.enabled or self._ref is None:
            return
        try:
            if self.synchronize:
                self.synchronize()
            for index, marks in self._pending:
                self._read(index, marks)
            self._pending.clear()
            assert self.event_factory is not None
            anchor = self.event_factory()
            h = self.clock()
            anchor.record()
            if self.synchronize:
                self.synchronize()
            self.offset_s = h - float(self._ref.elapsed_time(anchor)) / 1000.0
        except Exception as e:
            self.error = f"reading CUDA events failed: {type(e).__name__}: {e}"
        self._cur = []
        self.enabled = False

    def summary(self) -> dict[str, Any] | None:
        """Per read step: its marks as (name, host s, device s on the host clock) -> JSON rows."""
        if not self.read and not self.error:
            return None
        steps = []
        if self.offset_s is not None:
            for index in sorted(self.read):
                marks = [(n, h, self.offset_s + ms / 1000.0) for n, h, ms in self.read[index]]
                steps.append({"index": index, **step_device(marks)})
        return {"steps": steps, "error": self.error, "anchored": self.offset_s is not None}


def step_device(marks: list[tuple[str, float, float]]) -> dict[str, Any]:
    """One step's marks ``(name, host_s, device_s)`` (both on the host clock) -> device seconds per phase,
    the device span of the step, and how far the device trailed the host at the step's end."""
    phases = dict.fromkeys((*SEGMENT_PHASE.values(),), 0.0)
    for (_, _, g0), (name, _, g1) in itertools.pairwise(marks):
        phases[SEGMENT_PHASE.get(name, "post")] += max(0.0, g1 - g0)
    first, last = marks[0], marks[-1]
    data_ready = next((h for n, h, _ in marks if n == "data_ready"), None)
    return {
        **{f"{k}_s": v for k, v in phases.items()},
        "compute_s": sum(phases[p] for p in COMPUTE_PHASES),
        "span_s": last[2] - first[2],
        "lag_end_s": max(0.0, last[2] - last[1]),
        # the device finished the previous step's work this long after the host started this step
        "carry_in_s": max(0.0, first[2] - first[1]),
        "data_ready_host_s": None if data_ready is None else data_ready - first[1],
        # forward and optimizer both marked: a step whose model ran outside the hooks is not timed as idle
        "complete": {"fwd_start", "fwd_end", "opt_end"} <= {n for n, _, _ in marks},
    }


@dataclass
class Attribution:
    """One step's wall time as device busy + device idle, the idle split by cause (seconds)."""

    wall_s: float
    busy_s: float
    idle_s: float
    idle_data_s: float
    idle_launch_s: float | None
    idle_sync_s: float
    idle_other_s: float
    device_bound: bool


DEVICE_BOUND_SHARE = 0.9  # device busy this much of the wall time: the device is the bottleneck


def attribute(step: dict[str, Any], dev: dict[str, Any], launch_gap_s: float | None = None) -> Attribution:
    """``step`` is the host record (total_s, data_wait_s, sync_s, h2d_gpu_s), ``dev`` its ``step_device``.

    Busy: the device time of forward, backward and optimizer (+ its copies), less the launch gaps the
    trace measured between kernels where there is a trace. Idle = wall - busy, taken in order by: data
    wait during which the device had nothing queued (it finished the previous step ``carry_in_s`` after
    the host asked for data), launch gaps, host time blocked in syncs, and the rest (Python, logging)."""
    wall = float(step["total_s"])
    busy = dev["compute_s"] + float(step.get("h2d_gpu_s") or 0.0)
    if launch_gap_s is not None:
        busy = max(0.0, busy - launch_gap_s)
    busy = min(busy, wall)
    idle = max(0.0, wall - busy)
    left = idle
    data = min(left, max(0.0, float(step.get("data_wait_s", 0.0)) - dev.get("carry_in_s", 0.0)))
    left -= data
    launch = None
    if launch_gap_s is not None:
        launch = min(left, launch_gap_s)
        left -= launch
    sync = min(left, float(step.get("sync_s", 0.0)))
    left -= sync
    return Attribution(
        wall_s=wall,
        busy_s=busy,
        idle_s=idle,
        idle_data_s=data,
        idle_launch_s=launch,
        idle_sync_s=sync,
        idle_other_s=max(0.0, left),
        device_bound=busy >= DEVICE_BOUND_SHARE * wall,
    )


def device_breakdown(
    steps: list[dict[str, Any]], device_steps: list[dict[str, Any]], launch_gap_s: float | None = None
) -> dict[str, Any] | None:
    """Means over the steps that have both a host record and device times: host and device seconds per
    phase side by side, busy/idle and the idle's causes, and the share of device-bound steps."""
    by_index = {d["index"]: d for d in device_steps if d.get("complete", True)}
    pairs = [(s, by_index[s["index"]]) for s in steps if s["index"] in by_index]
    if not pairs:
        return None
    n = len(pairs)
    atts = [attribute(s, d, launch_gap_s) for s, d in pairs]

    def mean(values: list[float]) -> float:
        return sum(values) / n

    out: dict[str, Any] = {"steps": n}
    for phase in ("forward", "backward", "optimizer"):
        out[f"host_{phase}_s"] = mean([float(s.get(f"{phase}_s", 0.0)) for s, _ in pairs])
        out[f"device_{phase}_s"] = mean([d[f"{phase}_s"] for _, d in pairs])
    out["host_sync_s"] = mean([float(s.get("sync_s", 0.0)) for s, _ in pairs])
    out["host_data_wait_s"] = mean([float(s.get("data_wait_s", 0.0)) for s, _ in pairs])
    for f in ("wall_s", "busy_s", "idle_s", "idle_data_s", "idle_sync_s", "idle_other_s"):
        out[f] = mean([getattr(a, f) for a in atts])
    out["idle_launch_s"] = None if launch_gap_s is None else mean([a.idle_launch_s or 0.0 for a in atts])
    out["device_bound_share"] = sum(a.device_bound for a in atts) / n
    out["device_bound"] = out["device_bound_share"] >= 0.5
    return out
