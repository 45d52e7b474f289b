"""benchmarks/gpu_check.sh: the device-timing check on a fake CUDA run, and the dry run end to end on CPU."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmarks" / "gpu_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _fake_run(tmp_path: Path, device_span_per_step: float) -> Path:
    """A CUDA profile run's files: 5 steps, the last 4 traced (1 profiler warm-up + 3 active), events for
    each step, and a trace whose device activity spans 3 x 10 ms."""
    out = tmp_path / "profile_fake"
    out.mkdir(parents=True)
    steps = [{"index": i, "traced": i >= 1} for i in range(5)]
    # each step: 1 ms of data wait and Python before the forward and 1 ms after the optimizer, inside its span
    dev = [
        {
            "index": i,
            "span_s": device_span_per_step,
            "compute_s": 0.008,
            "data_s": 0.0008,
            "pre_s": 0.0002,
            "post_s": 0.001,
        }
        for i in range(5)
    ]
    meas = {"device": "cuda:0", "status": "stopped", "steps": steps, "device_time": {"steps": dev}}
    (out / "measurements.json").write_text(json.dumps(meas))
    kernels = [
        {
            "ph": "X",
            "cat": "kernel",
            "name": "k",
            "ts": 1000.0 + i * 10_000,
            "dur": 9_000.0,
            "pid": 0,
            "tid": 7,
            "args": {"device": 0, "stream": 7},
        }
        for i in range(3)
    ]
    kernels[-1]["dur"] = 10_000.0  # activity from 1000 to 31000 us: 30 ms
    (out / "trace.json").write_text(json.dumps({"traceEvents": kernels}))
    return out


def test_events_span_matching_the_trace_passes_and_a_wrong_one_fails(tmp_path):
    gc = _gpu_check()
    ok = gc.compare(_fake_run(tmp_path / "a", 0.0101))
    assert ok["steps"] == 3 and ok["verdict"] == "pass"
    assert ok["trace_span_s"] == pytest.approx(0.030) and ok["events_span_s"] == pytest.approx(0.0283)
    assert ok["trace_busy_s"] == pytest.approx(0.028)
    bad = gc.compare(_fake_run(tmp_path / "b", 0.013))
    assert bad["verdict"].startswith("FAIL")
    assert "| FAIL" in "\n".join(gc.table([bad]))


@pytest.mark.slow
def test_dry_run_runs_end_to_end_on_cpu_and_claims_no_gpu_figure(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable, "GPU_CHECK_WORK": str(tmp_path / "work")}
    env["GPU_CHECK_RESULTS"] = str(tmp_path / "results")
    r = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), "--dry-run"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr
    md = (tmp_path / "results" / "gpu_check.md").read_text()
    assert "DRY RUN on CPU: no GPU figure" in md
    for stage in ("doctor", "profile_healthy", "profile_overhead", "bench"):
        assert f"| {stage} | ok |" in md, md
    assert "not checked: no CUDA device in this run" in md and "| pass |" not in md
    for name in ("gpu_profile_overhead.md", "gpu_bench_small.md"):
        assert (tmp_path / "results" / name).read_text().startswith("> DRY RUN on CPU")
    assert json.loads((tmp_path / "work" / "doctor.json").read_text())["tool"] == "doctor"
