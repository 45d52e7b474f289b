"""Kernel analysis of Chrome traces: hand-built CUDA traces with known answers, and a real CPU trace."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pitstop.findings import Severity
from pitstop.profile.analyze.rules import findings_for
from pitstop.profile.capture import trace_analysis as ta
from pitstop.profile.record.timeline import StepRecord

ROOT = Path(__file__).resolve().parents[2]


def x(name, cat, ts, dur, pid=0, tid=7, **args):
    return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": pid, "tid": tid, "args": args}


def kernel(name, ts, dur, stream=7, device=0):
    return x(name, "kernel", ts, dur, pid=device, tid=stream, device=device, stream=stream)


def steps_of(n, length, t0=0.0):
    return [
        x(f"ProfilerStep#{i}", "user_annotation", t0 + i * length, length, pid=1, tid=1) for i in range(n)
    ]


def test_shares_of_kernel_memcpy_memset_comm_and_idle():
    # one 1000 us step: kernels 0-400, memcpy 400-500, memset 500-520, comm on stream 9 600-800 (300-500 overlaps
    # nothing on stream 9 so the device as a whole is busy 0-520 and 600-800)
    ev = [
        *steps_of(1, 1000.0),
        kernel("gemm", 0, 300),
        kernel("relu", 300, 100),
        x("Memcpy HtoD", "gpu_memcpy", 400, 100, pid=0, tid=7, device=0, stream=7),
        x("Memset", "gpu_memset", 500, 20, pid=0, tid=7, device=0, stream=7),
        kernel("ncclDevKernel_AllReduce", 600, 200, stream=9),
        x(
            "c10d::allreduce_", "cpu_op", 590, 20, pid=1, tid=1
        ),  # the host op that launched it: not device time
    ]
    rows = ta.stream_shares(ta.parse({"traceEvents": ev}))
    assert {r["device"] for r in rows} == {0}
    dev = next(r for r in rows if r["stream"] is None)
    assert dev["kernel_us"] == 400 and dev["memcpy_us"] == 100 and dev["memset_us"] == 20
    assert dev["comm_us"] == 200
    assert dev["idle_us"] == pytest.approx(1000 - 720)
    assert dev["idle_share"] == pytest.approx(0.28)
    s9 = next(r for r in rows if r["stream"] == 9)
    assert s9["comm_share"] == pytest.approx(0.2) and s9["kernel_us"] == 0


def test_top_kernels_by_total_device_time():
    ev = [*steps_of(1, 1000.0), kernel("a", 0, 10), kernel("b", 20, 300), kernel("a", 400, 10)]
    top = ta.top_kernels(ta.parse({"traceEvents": ev}))
    assert [r["name"] for r in top] == ["b", "a"]
    assert top[1]["calls"] == 2 and top[1]["mean_us"] == 10
    assert top[0]["share"] == pytest.approx(300 / 320)


def _launch_trace(kernel_us, gap_us, per_step=100, n_steps=3):
    length = per_step * (kernel_us + gap_us)
    ev = steps_of(n_steps, length)
    t = 0.0
    for _ in range(per_step * n_steps):
        ev.append(kernel("small", t, kernel_us))
        t += kernel_us + gap_us
    return ta.parse({"traceEvents": ev})


def test_many_short_kernels_with_longer_gaps_are_launch_bound():
    row = ta.launch_bound(_launch_trace(kernel_us=5.0, gap_us=15.0))[0]
    assert row["launch_bound"]
    assert row["kernels_per_step"] == 100
    assert row["median_kernel_us"] == 5.0 and row["median_gap_us"] == pytest.approx(15.0)
    assert row["gap_share"] == pytest.approx(0.75, abs=0.01)


def test_long_kernels_back_to_back_are_not_launch_bound():
    assert not ta.launch_bound(_launch_trace(kernel_us=500.0, gap_us=5.0))[0]["launch_bound"]
    # short kernels but packed: the device keeps up
    assert not ta.launch_bound(_launch_trace(kernel_us=5.0, gap_us=1.0))[0]["launch_bound"]


def test_comm_overlap_with_compute():
    ev = [*steps_of(1, 1000.0), kernel("gemm", 0, 500), kernel("ncclDevKernel_AllReduce", 400, 200, stream=9)]
    row = ta.comm_overlap(ta.parse({"traceEvents": ev}))[0]
    assert row["comm_us"] == 200 and row["overlapped_us"] == 100 and row["overlap_share"] == 0.5


def test_idle_cause_is_what_the_host_did_while_the_device_waited():
    ev = [
        *steps_of(1, 1000.0),
        kernel("gemm", 0, 200),
        x(
            "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",
            "user_annotation",
            200,
            600,
            pid=1,
            tid=1,
        ),
        kernel("gemm", 800, 200),
    ]
    row = ta.idle_causes(ta.parse({"traceEvents": ev}))[0]
    assert row["idle_us"] == 600 and row["main_cause"] == "data loading"
    assert row["causes_us"]["data loading"] == 600


def test_sync_idle_and_launch_latency():
    ev = [
        *steps_of(1, 1000.0),
        kernel("k", 0, 100),
        kernel("k", 150, 100),  # 50 us gap: launch latency
        x("aten::item", "cpu_op", 250, 700, pid=1, tid=1),
        kernel("k", 950, 50),
    ]
    row = ta.idle_causes(ta.parse({"traceEvents": ev}))[0]
    assert row["causes_us"]["launch latency"] == 50
    assert row["causes_us"]["host syncs"] == 700
    assert row["main_cause"] == "host syncs"


def _run_with_analysis(analysis, **data):
    steps = [
        StepRecord(index=i, start_s=i * 0.01, total_s=0.01, forward_s=0.004, backward_s=0.004)
        for i in range(5)
    ]
    return findings_for(steps, {"device": "cuda:0", "trace": {"analysis": analysis}, **data}, cores=4)[0]


def test_trace_findings_launch_bound_memcpy_and_idle_with_cause():
    ev = steps_of(2, 1000.0)
    t = 0.0
    for _ in range(120):  # 60 kernels per step, 4 us each, 12 us apart
        ev.append(kernel("small", t, 4.0))
        t += 16.0
    ev.append(x("Memcpy HtoD", "gpu_memcpy", 1950, 40, pid=0, tid=7, device=0, stream=7))
    analysis = ta.analyze(ta.parse({"traceEvents": ev}))
    found = {f.id: f for f in _run_with_analysis(analysis)}
    lb = found["gpu.launch_bound"]
    assert lb.severity is Severity.WARN and "60 kernels per step" in lb.evidence and "torch.compile" in lb.fix
    assert "gpu.memcpy" not in found  # 2% of the device's time
    assert found["gpu.idle"].data["trace_idle"]["main_cause"] in ("launch latency", "untraced")


def test_trace_idle_adds_its_cause_to_the_nvml_idle_finding():
    ev = [
        *steps_of(1, 1000.0),
        kernel("k", 0, 100),
        x("aten::item", "cpu_op", 100, 800, pid=1, tid=1),
        x("Memcpy DtoH", "gpu_memcpy", 900, 100, pid=0, tid=7, device=0, stream=7),
    ]
    gpu = {"mean_util_pct": 20.0, "index": 0, "samples": 30, "window": "measured steps"}
    found = _run_with_analysis(ta.analyze(ta.parse({"traceEvents": ev})), gpu_util=gpu)
    idle = [f for f in found if f.id == "gpu.idle"]
    assert len(idle) == 1
    assert "NVML" in idle[0].evidence and "Main cause: host syncs" in idle[0].evidence
    memcpy = next(f for f in found if f.id == "gpu.memcpy")
    assert "10%" in memcpy.title


def test_cpu_trace_self_time_nests():
    ev = [
        *steps_of(1, 1000.0),
        x("aten::linear", "cpu_op", 0, 500, pid=1, tid=1),
        x("aten::addmm", "cpu_op", 10, 400, pid=1, tid=1),
        x("aten::relu", "cpu_op", 600, 100, pid=1, tid=1),
    ]
    cpu = ta.cpu_summary(ta.parse({"traceEvents": ev}))
    assert cpu["op_share"] == pytest.approx(0.6)
    top = {r["name"]: r["self_us"] for r in cpu["top_ops"]}
    assert top == {"aten::addmm": 400, "aten::linear": 100, "aten::relu": 100}


def test_unreadable_trace_gives_an_error_not_a_traceback(tmp_path):
    bad = tmp_path / "trace.json"
    bad.write_text("{not json")
    assert "error" in ta.analyze_file(bad)


@pytest.mark.slow
def test_real_cpu_trace_from_pitstop_profile(tmp_path):
    script = tmp_path / "tiny.py"
    script.write_text(
        "import torch\n"
        "m = torch.nn.Linear(32, 32)\n"
        "opt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        "for _ in range(12):\n"
        "    loss = m(torch.randn(16, 32)).pow(2).mean()\n"
        "    loss.backward()\n"
        "    opt.step()\n"
        "    opt.zero_grad()\n"
    )
    out = tmp_path / "out"
    report = tmp_path / "r.json"
    cmd = [
        sys.executable,
        "-m",
        "pitstop",
        "profile",
        "--trace",
        "--steps",
        "5",
        "--warmup",
        "2",
        "--no-probes",
    ]
    cmd += ["--out-dir", str(out), "--json", str(report), "--quiet", "--", "python", str(script)]
    subprocess.run(cmd, check=False, cwd=ROOT, capture_output=True, timeout=300)
    analysis = json.loads(report.read_text())["sections"]["trace"]["analysis"]
    assert analysis["steps"] == 3 and analysis["devices"] == [] and analysis["top_kernels"] == []
    cpu = analysis["cpu"]
    assert 0.0 < cpu["op_share"] <= 1.0 and cpu["idle_share"] == pytest.approx(1 - cpu["op_share"])
    names = {r["name"] for r in cpu["top_ops"]}
    assert names & {"aten::addmm", "aten::mm", "aten::linear"}
    assert ta.analyze_file(out / "trace.json")["cpu"]["top_ops"] == cpu["top_ops"]
