"""``--trace``: torch.profiler over a bounded window of steps, a Chrome trace, and the top operators.

The window opens when the warm-up ends: one profiler warm-up step, then ``active`` recorded steps. Steps
inside the window are flagged ``traced`` so the timeline can leave their (slower) times out.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import torch

TOP_OPS = 15


class StepTracer:
    def __init__(self, out_dir: Path, active: int = 3) -> None:
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
        except Exception as e:
            self.error = f"torch.profiler failed to start: {type(e).__name__}: {e}"
            self.done = True

    def _ready(self, prof: Any) -> None:
        try:
            prof.export_chrome_trace(str(self.path))
        except Exception as e:
            self.error = f"could not write the trace: {type(e).__name__}: {e}"

    def step(self) -> None:
        if self.done:
            return
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
        if not self.top_ops:
            self.top_ops = top_ops(self.prof)

    def summary(self) -> dict[str, Any]:
        from pitstop.profile.trace_analysis import analyze_file

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
