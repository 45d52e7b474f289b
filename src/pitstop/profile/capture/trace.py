"""``--trace``: torch.profiler over a bounded window of steps, a Chrome trace, and the top operators.

The window opens when the warm-up ends: one profiler warm-up step, then ``active`` recorded steps. Steps
inside the window are flagged ``traced`` so the timeline can leave their (slower) times out.

The trace also carries pitstop's own view as a process of its own ("pitstop"): a track of the phases
the step clock counted (data wait, host-to-device copy, forward, backward, optimizer, host syncs: each
stretch as the clock booked it, innermost phase only) and a track of the steps, on torch.profiler's time
base, so one file in Perfetto shows both.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import time
from pathlib import Path
from typing import Any

import torch

from pitstop.profile.capture.stepclock import CLOSURE, PhaseClock
from pitstop.profile.record.timeline import PART_LABELS
from pitstop.report.jsonfmt import atomic_write_text

TOP_OPS = 15


PID = 0x7057  # the trace's process id for pitstop's tracks (any number torch.profiler does not use)
PHASE_NAMES = {**PART_LABELS, CLOSURE: "optimizer closure (other)"}


class StepTracer:
    def __init__(self, out_dir: Path, active: int = 3, phases: PhaseClock | None = None) -> None:
        self.phases = phases
        self.spans: list[tuple[str, float, float]] = []
        self.step_ends: list[tuple[int, float]] = []  # (step index, when it ended); -1: the window opened
        self.wall_minus_perf_us = 0.0
        self.out_dir = Path(out_dir)
        self.active_steps = active
        self.path = self.out_dir / "trace.json"
        self.steps_seen = 0
        self.done = False
        self.error: str | None = None
        self.top_ops: list[dict[str, Any]] = []
        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self.prof = torch.profiler.profile(
            activities=activities,
            schedule=torch.profiler.schedule(wait=0, warmup=1, active=active, repeat=1),
            on_trace_ready=self._ready,
            record_shapes=False,
        )

    @property
    def active(self) -> bool:
        return not self.done

    def start(self) -> None:
        try:
            self.prof.start()
            # torch.profiler stamps events on the wall clock; the step clock runs on perf_counter
            self.wall_minus_perf_us = time.time_ns() / 1e3 - time.perf_counter() * 1e6
            self.step_ends = [(-1, time.perf_counter())]
            if self.phases is not None:
                self.phases.spans = []
        except Exception as e:
            self.error = f"torch.profiler failed to start: {type(e).__name__}: {e}"
            self.done = True

    def _ready(self, prof: Any) -> None:
        try:
            prof.export_chrome_trace(str(self.path))
        except Exception as e:
            self.error = f"could not write the trace: {type(e).__name__}: {e}"

    def step(self, now: float | None = None, index: int = -1) -> None:
        if self.done:
            return
        self.step_ends.append((index, time.perf_counter() if now is None else now))
        self.steps_seen += 1
        self.prof.step()
        if self.steps_seen >= 1 + self.active_steps:
            self.finish()

    def finish(self) -> None:
        if self.done and self.top_ops:
            return
        was_running = not self.done
        self.done = True
        if was_running:
            with contextlib.suppress(Exception):
                self.prof.stop()
            if self.phases is not None and self.phases.spans is not None:
                self.spans, self.phases.spans = self.phases.spans, None
            if self.path.exists() and not self.error:
                try:
                    add_pitstop_tracks(self.path, self.spans, self.step_ends, self.wall_minus_perf_us)
                except Exception as e:  # the profiler's own trace stays as written
                    self.error = f"could not add pitstop's tracks to the trace: {type(e).__name__}: {e}"
        if not self.top_ops:
            self.top_ops = top_ops(self.prof)

    def summary(self) -> dict[str, Any]:
        from pitstop.profile.capture.trace_analysis import analyze_file

        exists = self.path.exists()
        return {
            "path": str(self.path) if exists else None,
            "steps": max(0, self.steps_seen - 1),
            "top_ops": self.top_ops,
            "error": self.error,
            "analysis": analyze_file(self.path) if exists else None,  # kernel/idle shares, launch-bound
        }


def top_ops(prof: Any, n: int = TOP_OPS) -> list[dict[str, Any]]:
    """Operators by self time (device self time first when there is one), as plain rows."""
    try:
        events = prof.key_averages()
    except Exception:
        return []
    rows = []
    for e in events:
        self_dev = getattr(e, "self_device_time_total", 0) or 0
        rows.append(
            {
                "name": e.key,
                "calls": e.count,
                "self_cpu_ms": e.self_cpu_time_total / 1000.0,
                "cpu_total_ms": e.cpu_time_total / 1000.0,
                "self_device_ms": self_dev / 1000.0,
            }
        )
    rows.sort(key=lambda r: (r["self_device_ms"], r["self_cpu_ms"]), reverse=True)
    return [r for r in rows if not r["name"].startswith("ProfilerStep")][:n]


def add_pitstop_tracks(
    path: Path,
    spans: list[tuple[str, float, float]],
    step_ends: list[tuple[int, float]],
    wall_minus_perf_us: float,
) -> int:
    """Append pitstop's phase and step tracks (perf_counter seconds) to the Chrome trace at ``path``, on
    its time base (wall-clock microseconds less ``baseTimeNanoseconds``). Returns the events added."""
    if len(step_ends) < 2:
        return 0
    doc = json.loads(path.read_text())
    events = doc.get("traceEvents") if isinstance(doc, dict) else None
    if not isinstance(events, list):
        raise ValueError("no traceEvents list")
    base_us = float(doc.get("baseTimeNanoseconds") or 0) / 1e3

    def us(t: float) -> float:
        return t * 1e6 + wall_minus_perf_us - base_us

    added: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": PID, "args": {"name": "pitstop"}},
        {"ph": "M", "name": "process_sort_index", "pid": PID, "args": {"sort_index": -1}},
        {"ph": "M", "name": "thread_name", "pid": PID, "tid": 1, "args": {"name": "steps"}},
        {"ph": "M", "name": "thread_name", "pid": PID, "tid": 2, "args": {"name": "phases (step clock)"}},
    ]
    for (_, a), (index, b) in itertools.pairwise(step_ends):
        added.append(_span(f"step {index}", 1, us(a), us(b), {"seconds": round(b - a, 6)}))
    first, last = step_ends[0][1], step_ends[-1][1]
    for phase, a, b in spans:
        a, b = max(a, first), min(b, last)  # a phase open when the window opened counts from there
        if b <= a:
            continue
        name = PHASE_NAMES.get(phase, phase)
        added.append(_span(name, 2, us(a), us(b), {"seconds": round(b - a, 9)}))
    events.extend(added)
    atomic_write_text(path, json.dumps(doc))
    return len(added)


def _span(name: str, tid: int, ts: float, end: float, args: dict[str, Any]) -> dict[str, Any]:
    return {
        "ph": "X",
        "cat": "pitstop",
        "name": name,
        "pid": PID,
        "tid": tid,
        "ts": ts,
        "dur": end - ts,
        "args": args,
    }
