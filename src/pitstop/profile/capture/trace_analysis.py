"""Kernel-level analysis of a torch.profiler Chrome trace, in the spirit of Holistic Trace Analysis.

Three layers, each usable alone:

- parsing: ``parse(trace_json) -> Trace``, the complete ("X") events as ``Event`` records with a kind
  (kernel, comm, memcpy, memset, cpu_op, runtime, annotation) and the traced steps' window;
- analysis: pure functions over a ``Trace`` (``stream_shares``, ``top_kernels``, ``launch_bound``,
  ``comm_overlap``, ``idle_causes``, ``cpu_summary``), each returning plain rows;
- presentation: ``analyze`` gathers them into one JSON-able dict for the report; rendering lives in
  ``pitstop.profile.present.gpu_render`` and findings in ``pitstop.profile.analyze.gpu_rules``.

Times are microseconds, as in the trace. On a CPU-only trace the device parts are empty and the CPU
part (op time vs idle on the main thread, top ops by self time) still applies.
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# launch-bound: many short kernels with the device idle longer between them than they run
LAUNCH_MIN_KERNELS_PER_STEP = 50
LAUNCH_MAX_MEDIAN_KERNEL_US = 50.0
LAUNCH_MIN_GAP_SHARE = 0.25
SHORT_GAP_US = 100.0  # an idle gap this short between kernels is launch latency, not a host stall
TOP_N = 10
COMM_PREFIXES = ("nccl", "ncclDevKernel", "ncclKernel", "c10d::", "gloo")
SYNC_MARKERS = (
    "cudaStreamSynchronize",
    "cudaDeviceSynchronize",
    "cudaEventSynchronize",
    "aten::_local_scalar_dense",
    "aten::item",
)
DATA_MARKERS = ("enumerate(DataLoader)", "DataLoader")
BLOCKING_COPY = ("cudaMemcpy", "cudaMemcpyAsync")
DEVICE_KINDS = ("kernel", "comm", "memcpy", "memset")


@dataclass(frozen=True)
class Event:
    name: str
    kind: str
    ts: float
    dur: float
    pid: Any
    tid: Any
    device: int | None = None
    stream: int | None = None

    @property
    def end(self) -> float:
        return self.ts + self.dur


@dataclass
class Trace:
    events: list[Event]
    steps: list[tuple[float, float]]  # the ProfilerStep annotations' [start, end)

    @property
    def window(self) -> tuple[float, float] | None:
        if self.steps:
            return self.steps[0][0], self.steps[-1][1]
        if not self.events:
            return None
        return min(e.ts for e in self.events), max(e.end for e in self.events)

    @property
    def n_steps(self) -> int:
        return max(1, len(self.steps))

    def of_kind(self, *kinds: str) -> list[Event]:
        return [e for e in self.events if e.kind in kinds]

    def on_device(self) -> list[Event]:
        """Device activity (kernels, collectives, copies, memsets), not the host ops that launched them."""
        return [e for e in self.events if e.kind in DEVICE_KINDS and e.device is not None]


# -------------------------------------------------------------------------------------------- parsing


def _kind(cat: str, name: str) -> str:
    cat = cat.lower()
    if cat == "kernel":
        return "comm" if name.lower().startswith(tuple(p.lower() for p in COMM_PREFIXES)) else "kernel"
    if cat in ("gpu_memcpy", "memcpy"):
        return "memcpy"
    if cat in ("gpu_memset", "memset"):
        return "memset"
    if cat in ("cuda_runtime", "cuda_driver", "runtime"):
        return "runtime"
    if cat in ("cpu_op", "operator"):
        return "comm" if name.startswith(("c10d::", "nccl:", "record_param_comms")) else "cpu_op"
    if cat in ("user_annotation", "python_function"):
        return "annotation"
    return "other"


def parse(trace: dict[str, Any]) -> Trace:
    """The complete events of a Chrome trace (``torch.profiler`` ``export_chrome_trace`` format)."""
    events: list[Event] = []
    steps: list[tuple[float, float]] = []
    for raw in trace.get("traceEvents", []):
        if raw.get("ph") != "X" or "dur" not in raw:
            continue
        name = str(raw.get("name", ""))
        cat = str(raw.get("cat", ""))
        ts, dur = float(raw.get("ts", 0.0)), float(raw.get("dur", 0.0))
        if name.startswith("ProfilerStep#"):
            steps.append((ts, ts + dur))
            continue
        args = raw.get("args") or {}
        kind = _kind(cat, name)
        device = args.get("device") if kind in ("kernel", "comm", "memcpy", "memset") else None
        stream = args.get("stream") if device is not None else None
        if kind in ("kernel", "comm", "memcpy", "memset") and device is None and cat.lower() != "cpu_op":
            device = raw.get("pid") if isinstance(raw.get("pid"), int) else 0
            stream = raw.get("tid")
        events.append(Event(name, kind, ts, dur, raw.get("pid"), raw.get("tid"), device, stream))
    steps.sort()
    return Trace(events=events, steps=steps)


def load(path: str | Path) -> Trace:
    return parse(json.loads(Path(path).read_text()))


# ------------------------------------------------------------------------------------------ intervals


def union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


def clip(intervals: list[tuple[float, float]], lo: float, hi: float) -> list[tuple[float, float]]:
    return [(max(s, lo), min(e, hi)) for s, e in intervals if e > lo and s < hi]


def length(intervals: list[tuple[float, float]]) -> float:
    return sum(e - s for s, e in intervals)


def intersect_len(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """Overlap of two unions of intervals (each sorted and disjoint)."""
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if hi > lo:
            total += hi - lo
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def gaps(busy: list[tuple[float, float]], lo: float, hi: float) -> list[tuple[float, float]]:
    out, t = [], lo
    for s, e in busy:
        if s > t:
            out.append((t, s))
        t = max(t, e)
    if hi > t:
        out.append((t, hi))
    return out


def _spans(events: list[Event], lo: float, hi: float) -> list[tuple[float, float]]:
    return union(clip([(e.ts, e.end) for e in events], lo, hi))


# ------------------------------------------------------------------------------------------- analysis


def stream_shares(trace: Trace) -> list[dict[str, Any]]:
    """Per device and per stream (``stream`` None = the device as a whole): time in kernels, memcpy,
    memset and communication, and idle, as shares of the traced window."""
    win = trace.window
    if win is None:
        return []
    lo, hi = win
    span = hi - lo
    dev_events = trace.on_device()
    rows = []
    for dev in sorted({e.device for e in dev_events}, key=str):
        on_dev = [e for e in dev_events if e.device == dev]
        for stream in [None, *sorted({e.stream for e in on_dev}, key=str)]:
            evs = on_dev if stream is None else [e for e in on_dev if e.stream == stream]
            row: dict[str, Any] = {"device": dev, "stream": stream, "window_us": span}
            for k in DEVICE_KINDS:
                row[f"{k}_us"] = length(_spans([e for e in evs if e.kind == k], lo, hi))
            busy = length(_spans(evs, lo, hi))
            row["busy_us"] = busy
            row["idle_us"] = max(0.0, span - busy)
            for k in (*DEVICE_KINDS, "idle"):
                row[f"{k}_share"] = row[f"{k}_us"] / span if span > 0 else 0.0
            rows.append(row)
    return rows


def top_kernels(trace: Trace, n: int = TOP_N) -> list[dict[str, Any]]:
    """Kernels (and collectives) by total device time in the window, with their share of it."""
    agg: dict[str, list[float]] = defaultdict(list)
    for e in trace.events:
        if e.kind in ("kernel", "comm"):
            agg[e.name].append(e.dur)
    total = sum(sum(v) for v in agg.values()) or 1.0
    rows = [
        {
            "name": name,
            "calls": len(d),
            "total_us": sum(d),
            "mean_us": sum(d) / len(d),
            "share": sum(d) / total,
        }
        for name, d in agg.items()
    ]
    rows.sort(key=lambda r: -r["total_us"])
    return rows[:n]


def launch_bound(trace: Trace) -> list[dict[str, Any]]:
    """Per device: kernels per step, median kernel time, median gap between kernels, the share of the
    window the device sat idle between kernels, and whether that makes it launch-bound (many short
    kernels, gaps longer than the kernels): the case torch.compile and CUDA graphs address."""
    win = trace.window
    if win is None:
        return []
    lo, hi = win
    out = []
    for dev in sorted({e.device for e in trace.on_device()}, key=str):
        evs = [e for e in trace.on_device() if e.device == dev]
        kernels = [e for e in evs if e.kind == "kernel" and e.end > lo and e.ts < hi]
        if not kernels:
            continue
        busy = _spans(evs, lo, hi)
        inner = gaps(busy, busy[0][0], busy[-1][1]) if busy else []  # between the first and last kernel
        gap_us = [e - s for s, e in inner]
        per_step = len(kernels) / trace.n_steps
        med_k = statistics.median(e.dur for e in kernels)
        med_gap = statistics.median(gap_us) if gap_us else 0.0
        gap_share = sum(gap_us) / (hi - lo) if hi > lo else 0.0
        out.append(
            {
                "device": dev,
                "kernels": len(kernels),
                "kernels_per_step": per_step,
                "median_kernel_us": med_k,
                "median_gap_us": med_gap,
                "gap_us_per_step": sum(gap_us) / trace.n_steps,
                "gap_share": gap_share,
                "launch_bound": per_step >= LAUNCH_MIN_KERNELS_PER_STEP
                and med_k <= LAUNCH_MAX_MEDIAN_KERNEL_US
                and med_gap > med_k
                and gap_share >= LAUNCH_MIN_GAP_SHARE,
            }
        )
    return out


def comm_overlap(trace: Trace) -> list[dict[str, Any]]:
    """Per device: communication time, and the share of it that ran while compute kernels ran."""
    win = trace.window
    if win is None:
        return []
    lo, hi = win
    out = []
    for dev in sorted({e.device for e in trace.of_kind("comm") if e.device is not None}, key=str):
        comm = _spans([e for e in trace.of_kind("comm") if e.device == dev], lo, hi)
        comp = _spans([e for e in trace.of_kind("kernel") if e.device == dev], lo, hi)
        c = length(comm)
        ov = intersect_len(comm, comp)
        out.append({"device": dev, "comm_us": c, "overlapped_us": ov, "overlap_share": ov / c if c else 0.0})
    return out


def idle_causes(trace: Trace) -> list[dict[str, Any]]:
    """Per device: what the host was doing while the device was idle in the window. Each idle moment goes
    to the first of: data loading, a host sync, a blocking copy, launch latency (a gap under
    ``SHORT_GAP_US`` between kernels), other host work (CPU ops), or nothing traced."""
    win = trace.window
    if win is None:
        return []
    lo, hi = win
    host = [
        e for e in trace.events if e.kind in ("cpu_op", "runtime", "annotation", "comm") and e.device is None
    ]
    marks = {
        "data loading": _spans([e for e in host if e.name.startswith(DATA_MARKERS)], lo, hi),
        "host syncs": _spans([e for e in host if e.name.startswith(SYNC_MARKERS)], lo, hi),
        "blocking copies": _spans(
            [e for e in host if e.kind == "runtime" and e.name in BLOCKING_COPY], lo, hi
        ),
    }
    host_work = _spans([e for e in host if e.kind == "cpu_op"], lo, hi)
    out = []
    for dev in sorted({e.device for e in trace.on_device()}, key=str):
        busy = _spans([e for e in trace.on_device() if e.device == dev], lo, hi)
        idle = gaps(busy, lo, hi)
        short = [(s, e) for s, e in idle if e - s < SHORT_GAP_US and s > lo and e < hi]
        long_ = [g for g in idle if g not in short]
        causes: dict[str, float] = {}
        remaining = long_
        for name, spans in marks.items():
            causes[name] = intersect_len(remaining, spans)
            remaining = _subtract(remaining, spans)
        causes["launch latency"] = length(short)
        causes["other host work"] = intersect_len(remaining, host_work)
        causes["untraced"] = length(_subtract(remaining, host_work))
        total = length(idle)
        top = max(causes, key=lambda k: causes[k]) if total > 0 else None
        out.append(
            {
                "device": dev,
                "idle_us": total,
                "idle_us_per_step": total / trace.n_steps,
                "causes_us": causes,
                "main_cause": top,
            }
        )
    return out


def _subtract(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for s, e in a:
        pieces = [(s, e)]
        for bs, be in b:
            if be <= s or bs >= e:
                continue
            nxt = []
            for ps, pe in pieces:
                if bs > ps:
                    nxt.append((ps, min(pe, bs)))
                if be < pe:
                    nxt.append((max(ps, be), pe))
            pieces = [(x, y) for x, y in nxt if y > x]
        out.extend(pieces)
    return out


def cpu_summary(trace: Trace, n: int = TOP_N) -> dict[str, Any]:
    """The busiest host thread: share of the window inside CPU ops vs outside them (Python, waits), and
    the top ops by self time (their time minus the ops nested in them)."""
    win = trace.window
    ops = trace.of_kind("cpu_op")
    if win is None or not ops:
        return {}
    lo, hi = win
    by_thread: dict[Any, list[Event]] = defaultdict(list)
    for e in ops:
        by_thread[(e.pid, e.tid)].append(e)
    thread, evs = max(by_thread.items(), key=lambda kv: length(_spans(kv[1], lo, hi)))
    busy = length(_spans(evs, lo, hi))
    span = hi - lo
    self_us: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    stack: list[list[Any]] = []  # [event, child time]
    for e in sorted(evs, key=lambda e: (e.ts, -e.dur)):
        while stack and stack[-1][0].end <= e.ts:
            done, child = stack.pop()
            self_us[done.name] += max(0.0, done.dur - child)
        if stack:
            stack[-1][1] += e.dur
        stack.append([e, 0.0])
        calls[e.name] += 1
    for done, child in stack:
        self_us[done.name] += max(0.0, done.dur - child)
    rows = sorted(
        (
            {"name": k, "calls": calls[k], "self_us": v, "share": v / span if span else 0.0}
            for k, v in self_us.items()
        ),
        key=lambda r: -r["self_us"],
    )
    return {
        "thread": str(thread[1]),
        "window_us": span,
        "op_us": busy,
        "op_share": busy / span if span else 0.0,
        "idle_share": max(0.0, 1 - busy / span) if span else 0.0,
        "top_ops": rows[:n],
    }


# --------------------------------------------------------------------------------------- presentation


def analyze(trace: Trace) -> dict[str, Any]:
    """Everything above, as one JSON-able dict (what ``--trace`` puts in the report)."""
    return {
        "steps": len(trace.steps),
        "window_us": (trace.window[1] - trace.window[0]) if trace.window else 0.0,
        "devices": stream_shares(trace),
        "top_kernels": top_kernels(trace),
        "launch": launch_bound(trace),
        "comm_overlap": comm_overlap(trace),
        "idle": idle_causes(trace),
        "cpu": cpu_summary(trace),
    }


def analyze_file(path: str | Path) -> dict[str, Any]:
    """``analyze`` of a trace file; a file that cannot be read gives ``{"error": ...}``."""
    try:
        return analyze(load(path))
    except (OSError, ValueError, TypeError, KeyError) as e:
        return {"error": f"could not analyse {path}: {type(e).__name__}: {e}"}
