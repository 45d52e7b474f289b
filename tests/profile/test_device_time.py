"""Device time per phase from CUDA events, with a fake CUDA timeline: fake events carry the time the
device reaches them; the host clock is scripted. No GPU needed."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from pitstop.findings import Severity
from pitstop.profile.analyze.rules import findings_for
from pitstop.profile.capture.device_time import DeviceTimer, attribute, device_breakdown, step_device
from pitstop.profile.capture.hooks import Config, Instrumentation
from pitstop.profile.record.timeline import StepRecord
from pitstop.profile.runs.result import build_report


class FakeEvent:
    """An event the fake device reaches at ``t`` (seconds, on the host clock); ``done`` says whether it has."""

    def __init__(self, timeline: FakeTimeline) -> None:
        self.timeline = timeline
        self.t: float | None = None

    def record(self) -> None:
        self.t = self.timeline.device_time_of_next()

    def query(self) -> bool:
        return self.t is not None and self.t <= self.timeline.device_now

    def elapsed_time(self, other: FakeEvent) -> float:
        assert self.t is not None and other.t is not None
        return (other.t - self.t) * 1000.0


class FakeTimeline:
    """Device timestamps for the events, in the order they are recorded."""

    def __init__(self, device_times: list[float]) -> None:
        self.times = list(device_times)
        self.device_now = float("inf")  # how far the device has got (for query)
        self.syncs = 0

    def device_time_of_next(self) -> float:
        return self.times.pop(0)

    def event(self) -> FakeEvent:
        return FakeEvent(self)

    def synchronize(self) -> None:
        self.syncs += 1


def timer(device_times: list[float], host_clock: float) -> tuple[DeviceTimer, FakeTimeline]:
    tl = FakeTimeline(device_times)
    return DeviceTimer(
        event_factory=tl.event, synchronize=tl.synchronize, clock=lambda: host_clock, enabled=True
    ), tl


# host times of one step's marks, and device times for a GPU-bound step: the host launches forward,
# backward and optimizer in 3 ms, then blocks in .item() while the GPU computes for ~98 ms
HOST = [
    ("data_ready", 0.001),
    ("fwd_start", 0.001),
    ("fwd_end", 0.002),
    ("bwd_end", 0.003),
    ("opt_end", 0.004),
]
GPU_BOUND = [0.0005, 0.001, 0.0011, 0.040, 0.090, 0.0995, 0.0996]  # step_start .. step_end


def run_step(t: DeviceTimer, host: list[tuple[str, float]], end: float, index: int = 1) -> None:
    t.close_step(index - 1, 0.0)  # the boundary that opens the step
    for name, h in host:
        t.mark(name, h)
    t.close_step(index, end)


def gpu_bound_device_step() -> dict:
    t, _ = timer([*GPU_BOUND, 1.0], host_clock=1.0)  # anchor: recorded on an idle device at host 1.0
    run_step(t, HOST, end=0.1)
    t.finish()
    return t.summary()["steps"][0]


def test_marks_become_device_time_per_phase():
    dev = gpu_bound_device_step()
    assert dev["index"] == 1
    assert dev["forward_s"] == pytest.approx(0.0389)
    assert dev["backward_s"] == pytest.approx(0.050)
    assert dev["optimizer_s"] == pytest.approx(0.0095)
    assert dev["compute_s"] == pytest.approx(0.0984)
    assert dev["carry_in_s"] == pytest.approx(0.0005)
    assert dev["lag_end_s"] == pytest.approx(0.0, abs=1e-9)


def _sync_site(per_step_s: float, steps: int) -> dict:
    return {
        "location": "train.py:40",
        "method": "item",
        "count": steps,
        "measured_count": steps,
        "time_s": per_step_s * steps,
        "loop_gap_s": 0.0,
    }


def test_gpu_bound_step_is_compute_not_sync():
    dev = gpu_bound_device_step()
    n = 8
    steps = [
        StepRecord(
            index=i,
            start_s=0.1 * i,
            total_s=0.1,
            data_wait_s=0.001,
            forward_s=0.001,
            backward_s=0.001,
            optimizer_s=0.001,
            sync_s=0.0955,
            syncs=1,
        )
        for i in range(n)
    ]
    data = {
        "device": "cuda:0",
        "sync_sites": [_sync_site(0.0955, n)],
        "device_time": {"steps": [{**dev, "index": i} for i in range(n)], "anchored": True},
        "steps": [s.to_dict() for s in steps],
    }
    host_only = {
        f.id: f for f in findings_for(steps, {k: v for k, v in data.items() if k != "device_time"}, 4)[0]
    }
    assert host_only["sync.item"].est_saving_s == pytest.approx(0.0955)  # what host timing alone claims
    found = {f.id: f for f in findings_for(steps, data, cores=4)[0]}
    sync = found["sync.item"]
    assert sync.est_saving_s < 0.002  # only the device idle a sync can remove
    assert sync.severity is Severity.INFO
    assert sync.data["host_timed_saving_s"] == pytest.approx(0.0955)
    assert "gpu.idle" not in found
    br = device_breakdown([s.to_dict() for s in steps], data["device_time"]["steps"])
    assert br["device_bound"] and br["busy_s"] == pytest.approx(0.0984)
    assert br["device_forward_s"] > 30 * br["host_forward_s"]


def test_data_bound_step_idles_the_gpu_for_data():
    # host: 80 ms loading, then 10 ms of GPU work launched and finished within the step
    host = [
        ("data_ready", 0.080),
        ("fwd_start", 0.080),
        ("fwd_end", 0.082),
        ("bwd_end", 0.084),
        ("opt_end", 0.085),
    ]
    gpu = [0.0002, 0.0801, 0.0801, 0.084, 0.088, 0.0899, 0.0901, 1.0]
    t, _ = timer(gpu, host_clock=1.0)
    run_step(t, host, end=0.090)
    t.finish()
    dev = t.summary()["steps"][0]
    rec = {"index": 1, "total_s": 0.090, "data_wait_s": 0.080, "sync_s": 0.0}
    a = attribute(rec, dev)
    assert a.busy_s == pytest.approx(0.0098)
    assert a.idle_data_s == pytest.approx(0.0798)
    assert not a.device_bound
    step = StepRecord(
        index=1,
        start_s=0.0,
        total_s=0.09,
        data_wait_s=0.08,
        forward_s=0.002,
        backward_s=0.002,
        optimizer_s=0.001,
    )
    data = {"device": "cuda:0", "device_time": {"steps": [dev]}}
    found = {f.id: f for f in findings_for([step], data, cores=4)[0]}
    assert "Main cause: data wait" in found["gpu.idle"].evidence


def test_launch_gaps_from_the_trace_move_busy_time_to_idle():
    dev = step_device(
        [
            ("step_start", 0.0, 0.0),
            ("fwd_start", 0.0, 0.0),
            ("fwd_end", 0.01, 0.01),
            ("opt_end", 0.02, 0.02),
            ("step_end", 0.02, 0.02),
        ]
    )
    a = attribute({"total_s": 0.02, "data_wait_s": 0.0, "sync_s": 0.0}, dev, launch_gap_s=0.012)
    assert a.busy_s == pytest.approx(0.008) and a.idle_launch_s == pytest.approx(0.012)


def test_steps_without_forward_marks_are_not_counted_as_idle():
    dev = step_device([("step_start", 0.0, 0.0), ("opt_end", 0.01, 0.01), ("step_end", 0.02, 0.02)])
    assert not dev["complete"]
    assert device_breakdown([{"index": 0, "total_s": 0.02}], [{**dev, "index": 0}]) is None


def test_events_are_read_only_once_complete_and_in_batches():
    tl = FakeTimeline([float(i) for i in range(100)])
    t = DeviceTimer(event_factory=tl.event, synchronize=tl.synchronize, enabled=True, read_every=3)
    tl.device_now = -1.0  # the device has not reached anything yet
    t.close_step(0, 0.0)
    for i in range(1, 4):
        t.mark("fwd_start", float(i))
        t.close_step(i, float(i))
    assert t.read == {} and len(t._pending) == 3  # polled at 3 pending, nothing complete: no wait
    tl.device_now = 4.0  # the device got past the first two steps' ends
    t.mark("fwd_start", 4.0)
    t.close_step(4, 4.0)
    assert sorted(t.read) == [1, 2]
    assert tl.syncs == 0
    t.finish()
    assert sorted(t.read) == [1, 2, 3, 4] and tl.syncs >= 1 and not t.enabled


def test_disabled_off_cuda_and_marks_cost_nothing():
    t = DeviceTimer()
    t.close_step(0, 0.0, torch.device("cpu"))
    t.mark("fwd_start", 0.1)
    assert not t.enabled and t.summary() is None


def test_instrumentation_marks_every_phase_in_order():
    tl = FakeTimeline([i * 0.001 for i in range(10_000)])
    inst = Instrumentation(Config(warmup=0, steps=100, full=True))
    inst.device_timer = DeviceTimer(event_factory=tl.event, synchronize=tl.synchronize, enabled=True)
    inst.install()
    try:
        ds = TensorDataset(torch.randn(32, 4), torch.randint(0, 2, (32,)))
        model = nn.Linear(4, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in DataLoader(ds, batch_size=8):
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        inst.close_pending()
    finally:
        inst.uninstall()
    t = inst.device_timer
    names = [n for n, _, _ in t._pending[1][1]]
    assert names == ["step_start", "data_ready", "fwd_start", "fwd_end", "bwd_end", "opt_end", "step_end"]
    t.finish()
    summary = t.summary()
    # timing starts at the first step boundary on CUDA: the first step (warm-up) has no opening event
    assert summary["anchored"] and [s["index"] for s in summary["steps"]] == [1, 2, 3]
    assert all(s["forward_s"] > 0 and s["backward_s"] > 0 for s in summary["steps"])


def test_report_shows_device_time_next_to_host_time():
    from pitstop.profile.runs.runner import RunResult

    dev = gpu_bound_device_step()
    steps = [
        StepRecord(index=i, start_s=0.1 * i, total_s=0.1, forward_s=0.001, sync_s=0.095) for i in range(4)
    ]
    data = {
        "device": "cuda:0",
        "device_time": {"steps": [{**dev, "index": i} for i in range(4)]},
        "steps": [s.to_dict() for s in steps],
        "totals": {"forwards": 4},
    }
    result = RunResult(
        0, None, steps, [], {}, None, 1.0, status="stopped", data=data, command=["python", "t.py"]
    )
    report = build_report(result)
    dt = report.sections["device_time"]
    assert dt["host_forward_s"] == pytest.approx(0.001) and dt["device_forward_s"] == pytest.approx(0.0389)
    from rich.console import Console

    from pitstop.profile.present.gpu_render import print_gpu

    console = Console(record=True, width=100)
    print_gpu(report, console)
    text = console.export_text()
    assert "device-bound" in text and "forward 38.9 vs 1.0" in text
