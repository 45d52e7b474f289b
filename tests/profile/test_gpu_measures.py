"""MFU, the GPU probes and CUDA memory, on CPU: real FLOP counts, fake CUDA backends and snapshots."""

from __future__ import annotations

import os
import pickle

import pytest
import torch
from torch import nn

from pitstop.bench.measure import Peak
from pitstop.findings import Severity
from pitstop.profile.analyze.gpu_rules import memory_findings, mfu_findings, probe_findings
from pitstop.profile.capture import gpu_memory
from pitstop.profile.probe import gpu_probes, mfu
from pitstop.profile.record.timeline import StepRecord, breakdown


class Events:
    """Fake CUDA events: each recorded event takes the next scripted device time (seconds)."""

    def __init__(self, times: list[float]) -> None:
        self.times = list(times)

    def event(self) -> Events.Event:
        return Events.Event(self)

    def synchronize(self) -> None:
        pass

    class Event:
        def __init__(self, owner: Events) -> None:
            self.owner, self.t = owner, 0.0

        def record(self) -> None:
            self.t = self.owner.times.pop(0)

        def elapsed_time(self, other: Events.Event) -> float:
            return (other.t - self.t) * 1000.0


# ------------------------------------------------------------------------------------------------ MFU


def test_flops_of_a_linear_training_pass():
    model = nn.Linear(64, 32, bias=False)
    x = torch.randn(16, 64)
    # forward 2*B*I*O, backward the weight's gradient 2*B*I*O (the input needs none)
    assert mfu.count_flops(model, ((x,), {}), {}) == 4 * 16 * 64 * 32


def test_measure_uses_the_compute_dtype_and_a_small_bounded_peak(monkeypatch):
    calls = []

    def fake_peak(dtype, device="cpu", sizes=None, min_run_time=0.3):
        calls.append((dtype, device, sizes, min_run_time))
        return Peak(dtype, 512, 1e11, 0.001)

    monkeypatch.setattr("pitstop.matmul.matmul_peak", fake_peak)
    model = nn.Linear(8, 8, bias=False)
    m = mfu.measure(model, ((torch.randn(4, 8),), {}), {"autocast": True, "autocast_dtype": "bfloat16"})
    assert calls == [("bfloat16", "cpu", mfu.PEAK_SIZES["cpu"], mfu.PEAK_MIN_RUN_S)]
    assert m["dtype"] == "bfloat16" and m["peak_flops_per_s"] == 1e11 and m["flops_per_pass"] > 0
    assert mfu.measure(None, None, {})["skipped"]
    slow = mfu.measure(model, ((torch.randn(4, 8),), {}), {}, probes={"pass_s": mfu.MAX_PASS_S + 1})
    assert "took" in slow["skipped"] and len(calls) == 1  # neither counted nor peaked


def test_mfu_section_and_finding():
    m = {
        "flops_per_pass": 2e9,
        "peak_flops_per_s": 1e12,
        "dtype": "float32",
        "device": "cpu",
        "peak_size": 512,
    }
    sec = mfu.section(m, median_step_s=0.01, passes_per_step=2)
    assert sec["flops_per_step"] == 4e9 and sec["achieved_flops_per_s"] == pytest.approx(4e11)
    assert sec["mfu"] == pytest.approx(0.4) and sec["peak"] == 1e12 and sec["dtype"] == "float32"
    (f,) = mfu_findings(sec)
    assert f.id == "compute.mfu" and f.severity is Severity.INFO and "40.0%" in f.title
    assert mfu.section({"skipped": "slow"}, 0.01, 1) == {"skipped": "slow"}


@pytest.mark.slow
def test_mfu_lands_in_a_real_profile_report(tmp_path):
    import json
    import subprocess
    import sys
    from pathlib import Path

    script = tmp_path / "tiny.py"
    script.write_text(
        "import torch\nm = torch.nn.Linear(64, 64)\nopt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        "for _ in range(10):\n    m(torch.randn(32, 64)).pow(2).mean().backward()\n    opt.step()\n"
        "    opt.zero_grad()\n"
    )
    report = tmp_path / "r.json"
    cmd = [sys.executable, "-m", "pitstop", "profile", "--steps", "4", "--warmup", "1", "--quiet"]
    cmd += ["--json", str(report), "--", "python", str(script)]
    subprocess.run(
        cmd, cwd=Path(__file__).resolve().parents[2], capture_output=True, timeout=300, check=False
    )
    sec = json.loads(report.read_text())["sections"]["mfu"]
    # Linear 64x64 with bias on 32 samples: forward 2*32*64*64, weight grad the same (no input grad)
    assert sec["flops_per_step"] == 4 * 32 * 64 * 64
    assert sec["dtype"] == "float32" and sec["peak"] > 0 and sec["mfu"] > 0


# ----------------------------------------------------------------------------------------- GPU probes


class FakeScaler:
    def __init__(self):
        self.scaled = 0

    def scale(self, t):
        self.scaled += 1
        return t * 1024.0


def fake_backend(capability=(8, 0), precision="highest", timeline=None, cudnn_benchmark=False):
    state = {"precision": precision, "set": [], "cudnn_benchmark": cudnn_benchmark}
    scaler = FakeScaler()
    tl = timeline or Events([i * 0.001 for i in range(1000)])

    def set_precision(p):
        state["set"].append(p)
        state["precision"] = p

    be = gpu_probes.Backend(
        event_factory=tl.event,
        synchronize=tl.synchronize,
        pin=lambda t: t.clone(),
        capability=lambda: capability,
        get_matmul_precision=lambda: state["precision"],
        set_matmul_precision=set_precision,
        grad_scaler=lambda: scaler,
        get_cudnn_benchmark=lambda: state["cudnn_benchmark"],
        set_cudnn_benchmark=lambda on: state.update(cudnn_benchmark=on),
    )
    return be, state, scaler


def _model_and_base():
    model = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))
    x = torch.randn(8, 16)

    def base():
        model.zero_grad(set_to_none=True)
        model(x).float().mean().backward()

    return model, x, base


def test_ampere_fp32_model_gets_fp16_scaler_and_tf32_probes_and_settings_are_restored():
    model, x, base = _model_and_base()
    be, state, scaler = fake_backend((8, 0), "highest")
    out = gpu_probes.run(model, (x,), {}, {"param_dtypes": ["float32"]}, base, be, device_type="cpu")
    assert set(out) == {"fp16_scaler", "tf32"}  # no device tensors in the batch: no copy probe
    assert scaler.scaled >= 4  # every fp16 pass scaled its loss
    assert state["set"] and set(state["set"]) == {"high", "highest"} and state["precision"] == "highest"
    for p in out.values():
        assert p["saving_s"] == pytest.approx(p["base_s"] - p["new_s"])


def test_tf32_probe_only_where_it_can_change_something():
    model, x, base = _model_and_base()
    facts = {"param_dtypes": ["float32"]}
    assert "tf32" not in gpu_probes.run(model, (x,), {}, facts, base, fake_backend((7, 5))[0], "cpu")
    assert "tf32" not in gpu_probes.run(model, (x,), {}, facts, base, fake_backend((8, 0), "high")[0], "cpu")
    assert (
        gpu_probes.run(model, (x,), {}, {"param_dtypes": ["bfloat16"]}, base, fake_backend()[0], "cpu") == {}
    )


def test_pinned_copy_probe_times_with_events():
    # each copy's events: pageable 4 ms on the device, pinned 1 ms, repeated
    times = []
    t = 0.0
    for _ in range(gpu_probes.COPY_REPS + 1):
        for dur in (0.004, 0.001):
            times += [t, t + dur]
            t += 0.01
    be, _, _ = fake_backend(timeline=Events(times))
    out = gpu_probes.h2d_probe([torch.randn(64, 64)], torch.device("cpu"), be)
    assert out["bytes"] == 64 * 64 * 4
    assert out["pageable_device_s"] == pytest.approx(0.004) and out["pinned_device_s"] == pytest.approx(0.001)
    assert out["saving_s"] == pytest.approx(out["pageable_host_s"] - out["pinned_host_s"])


def test_probe_findings_fp16_tf32_and_pin_memory():
    from pitstop.findings import Finding

    bd = breakdown([StepRecord(index=i, start_s=0.1 * i, total_s=0.1, forward_s=0.05) for i in range(10)])
    probes = {
        "fp16_scaler": {"base_s": 0.05, "new_s": 0.02, "saving_s": 0.03},
        "precision": {"dtype": "bfloat16", "base_s": 0.05, "new_s": 0.03, "saving_s": 0.02},
        "tf32": {
            "base_s": 0.05,
            "new_s": 0.049,
            "saving_s": 0.001,
            "saving_lo_s": -0.001,
            "saving_hi_s": 0.003,
        },
        "h2d": {
            "bytes": 2**20,
            "pageable_host_s": 0.004,
            "pageable_device_s": 0.003,
            "pinned_host_s": 0.0005,
            "pinned_device_s": 0.001,
            "base_s": 0.004,
            "new_s": 0.0005,
            "saving_s": 0.0035,
        },
    }
    pin = Finding(
        id="dataloader.pin_memory", severity=Severity.WARN, title="t", est_saving_s=0.006, share=0.06
    )
    found = {f.id: f for f in probe_findings([pin], bd, probes)}
    assert found["precision.fp16"].est_saving_s == pytest.approx(0.01)  # over bf16, not over fp32
    assert found["precision.tf32"].severity is Severity.PASS  # at most 3 ms of a 100 ms step
    # the same 2% without an interval is undecided, not a pass
    unsure = {**probes, "tf32": {"base_s": 0.05, "new_s": 0.049, "saving_s": 0.001}}
    tf32 = {f.id: f for f in probe_findings([pin], bd, unsure)}["precision.tf32"]
    assert tf32.severity is Severity.INFO and tf32.data["verdict"] == "undecided"
    assert found["dataloader.pin_memory"].est_saving_s == pytest.approx(0.0035)
    assert "pinned and non_blocking 500 us" in found["dataloader.pin_memory"].evidence


# --------------------------------------------------------------------------------------------- memory


class FakeCuda:
    def __init__(self, snapshot=None):
        self.snapshot = snapshot or {}
        self.history = []

        class Memory:
            @staticmethod
            def _snapshot():
                return self.snapshot

            @staticmethod
            def _record_memory_history(**kw):
                self.history.append(kw)

        self.memory = Memory

    def max_memory_allocated(self, d):
        return 3 * 2**30

    def max_memory_reserved(self, d):
        return 4 * 2**30

    def memory_allocated(self, d):
        return 2**30

    def memory_reserved(self, d):
        return 2 * 2**30


def test_memory_facts_peaks_and_fragmentation():
    facts = gpu_memory.memory_facts(torch.device("cuda", 0), FakeCuda())
    assert facts["cuda_fragmentation_bytes"] == 2**30
    assert facts["cuda_peak_fragmentation_bytes"] == 2**30
    assert gpu_memory.memory_facts(torch.device("cpu"), FakeCuda()) == {}
    (f,) = memory_findings(facts)
    assert f.id == "memory.fragmentation" and "1024 MiB" in f.title and "expandable_segments" in f.fix_code


def _snapshot():
    lib = os.path.join(os.path.dirname(torch.__file__), "nn", "modules", "linear.py")
    user = [
        {"filename": lib, "line": 1, "name": "forward"},
        {"filename": "/home/me/train.py", "line": 42, "name": "main"},
    ]
    return {
        "segments": [
            {
                "blocks": [
                    {"size": 2**30, "state": "active_allocated", "frames": user},
                    {"size": 2**29, "state": "active_allocated", "frames": user},
                    {"size": 2**31, "state": "inactive", "frames": user},
                    {"size": 2**20, "state": "active_allocated", "frames": []},
                ]
            }
        ]
    }


def test_oom_snapshot_saved_with_largest_allocations_by_line(tmp_path):
    cuda = FakeCuda(_snapshot())
    oom = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    out = gpu_memory.save_oom_snapshot(oom, tmp_path, cuda)
    assert pickle.loads((tmp_path / gpu_memory.SNAPSHOT).read_bytes()) == _snapshot()
    top = out["largest"]
    assert (
        top[0]["location"].endswith("train.py:42")
        and top[0]["bytes"] == 2**30 + 2**29
        and top[0]["blocks"] == 2
    )
    assert top[1] == {"location": "<no stack recorded>", "bytes": 2**20, "blocks": 1}
    assert gpu_memory.save_oom_snapshot(ValueError("other"), tmp_path, cuda) is None
    (f,) = memory_findings({"oom": out})
    assert f.id == "memory.oom" and f.severity is Severity.WARN and "train.py:42 1536 MiB" in f.evidence


def test_host_memory_errors_are_not_gpu_ooms(tmp_path):
    cpu_oom = torch.OutOfMemoryError("DefaultCPUAllocator: can't allocate memory")
    assert gpu_memory.save_oom_snapshot(cpu_oom, tmp_path, FakeCuda()) is None


@pytest.mark.slow
def test_a_cuda_oom_in_the_script_leaves_a_snapshot_and_a_finding(tmp_path):
    """The bootstrap's path end to end; on a CPU the allocator snapshot is real but empty."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    script = tmp_path / "oom.py"
    script.write_text(
        "import torch\nraise torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 20.00 GiB')\n"
    )
    out, report = tmp_path / "out", tmp_path / "r.json"
    cmd = [
        sys.executable,
        "-m",
        "pitstop",
        "profile",
        "--quiet",
        "--out-dir",
        str(out),
        "--json",
        str(report),
    ]
    subprocess.run(
        [*cmd, "--", "python", str(script)],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        timeout=300,
        check=False,
    )
    assert pickle.loads((out / gpu_memory.SNAPSHOT).read_bytes())["segments"] == []
    found = {f["id"]: f for f in json.loads(report.read_text())["findings"]}
    assert "no stacks recorded" in found["memory.oom"]["evidence"]


def test_history_runs_until_the_warm_up_ends_and_can_be_turned_off(monkeypatch):
    monkeypatch.setattr(gpu_memory, "_recording", [])  # this process's state, restored after the test
    cuda = FakeCuda()
    gpu_memory.stop_history()  # never started: touches nothing
    assert gpu_memory.start_history(cuda) and not gpu_memory.start_history(cuda)  # once
    assert cuda.history == [
        {"context": "state", "stacks": "python", "max_entries": gpu_memory.HISTORY_ENTRIES}
    ]
    gpu_memory.stop_history()
    assert cuda.history[-1] == {"enabled": None}
    monkeypatch.setenv("PITSTOP_MEMORY_HISTORY", "all")
    assert gpu_memory.start_history(cuda)
    gpu_memory.stop_history()
    assert len(cuda.history) == 3  # kept on for the whole run
    monkeypatch.setattr(gpu_memory, "_recording", [])
    monkeypatch.setenv("PITSTOP_MEMORY_HISTORY", "0")
    assert not gpu_memory.start_history(cuda) and len(cuda.history) == 3
