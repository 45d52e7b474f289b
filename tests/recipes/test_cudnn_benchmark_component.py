"""The cuDNN autotuning component (``pitstop.recipes.cudnn_benchmark``): its process-wide setting (CUDA
only), the probe's arms on a fake device, its rule on synthetic probe results, fix's candidate (and why none
on CPU), train's backends, the profile injection and its ``fix --apply`` edit on a small script."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from pitstop.findings import Severity
from pitstop.fix.apply import FileEdits, ModelEditor
from pitstop.fix.core import FixConfig, build_candidates
from pitstop.profile.analyze.gpu_rules import probe_findings
from pitstop.profile.analyze.rulekit import PHASE_OF
from pitstop.profile.record.overrides import Overrides
from pitstop.profile.record.timeline import Breakdown
from pitstop.recipes import component, components, cudnn_benchmark, recipe
from pitstop.recipes.component import PROCESS
from pitstop.recipes.knobs import Knobs


@pytest.fixture
def benchmark_off():
    """cuDNN autotuning off for the test, the process's setting restored after it."""
    saved = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = False
    yield
    torch.backends.cudnn.benchmark = saved


def test_the_registry_entry_takes_its_names_from_the_module():
    r = recipe("cudnn_benchmark")
    assert component("cudnn_benchmark") is cudnn_benchmark and cudnn_benchmark in components(PROCESS)
    got = (r.snippet, r.finding, r.probe, r.override)
    assert got == (cudnn_benchmark.SNIPPET, "cudnn.benchmark", "cudnn_benchmark", "cudnn_benchmark")
    assert r.train == "TrainConfig.cudnn_benchmark" and r.apply == "pitstop.fix.apply.apply_component"
    assert (
        Overrides.setting(r.override, True) == Overrides(cudnn_benchmark=True) and not Knobs().cudnn_benchmark
    )
    assert PHASE_OF["cudnn.benchmark"] == ("forward_s", "backward_s")


def test_apply_sets_it_on_cuda_only_and_scoped_restores_it(benchmark_off):
    assert cudnn_benchmark.apply("cpu", True) == {} and not torch.backends.cudnn.benchmark
    assert cudnn_benchmark.apply("cuda", True) == {"cudnn_benchmark": True} and torch.backends.cudnn.benchmark
    assert cudnn_benchmark.apply("cuda", False) == {"cudnn_benchmark": False}
    assert not torch.backends.cudnn.benchmark
    with cudnn_benchmark.scoped("cuda", True):
        assert torch.backends.cudnn.benchmark
    assert not torch.backends.cudnn.benchmark
    with cudnn_benchmark.scoped("cpu", True):
        assert not torch.backends.cudnn.benchmark


def test_train_backends_call_it(benchmark_off):
    from pitstop.train.backends import configure_backends

    assert configure_backends("cpu") == {} and not torch.backends.cudnn.benchmark
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.get_float32_matmul_precision())
    try:
        assert configure_backends("cuda", tf32=False)["cudnn_benchmark"] is True
        assert torch.backends.cudnn.benchmark
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved[0]
        torch.set_float32_matmul_precision(saved[1])


class FakeDevice:
    """A GPU's cuDNN autotuning switch (``component.DeviceSettings``), recording what was set."""

    def __init__(self, on: bool = False) -> None:
        self.on, self.set = on, []

    def get_cudnn_benchmark(self) -> bool:
        return self.on

    def set_cudnn_benchmark(self, on: bool) -> None:
        self.on = on
        self.set.append(on)


def test_probe_applies_to_a_conv_net_left_off_and_its_arm_restores():
    assert cudnn_benchmark.applies({"conv2d_layers": 3}, FakeDevice())
    assert not cudnn_benchmark.applies({"conv2d_layers": 3}, FakeDevice(on=True))  # the script set it
    assert not cudnn_benchmark.applies({"conv2d_layers": 0}, FakeDevice())
    assert not cudnn_benchmark.applies({}, FakeDevice())
    dev, seen = FakeDevice(), []
    cudnn_benchmark.changed(lambda: seen.append(dev.on), dev)()
    assert seen == [True] and dev.set == [True, False] and dev.on is False


def fake_backend(on: bool = False):
    """A ``gpu_probes.Backend`` whose only live parts are the capability and the autotuning switch."""
    from pitstop.profile.probe import gpu_probes

    dev = FakeDevice(on)

    def unused(*_: object) -> None:
        raise AssertionError("not called for this probe")

    be = gpu_probes.Backend(
        event_factory=unused,
        synchronize=unused,
        pin=unused,
        capability=lambda: (8, 0),
        get_matmul_precision=lambda: "highest",
        set_matmul_precision=unused,
        grad_scaler=unused,
        get_cudnn_benchmark=dev.get_cudnn_benchmark,
        set_cudnn_benchmark=dev.set_cudnn_benchmark,
    )
    return be, dev


def test_gpu_probes_time_it_for_a_conv_net_on_a_fake_backend():
    from pitstop.profile.probe import gpu_probes

    model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.Flatten())
    x = torch.randn(2, 1, 5, 5)

    def base():
        model.zero_grad(set_to_none=True)
        model(x).mean().backward()

    facts = {"param_dtypes": ["bfloat16"], "conv2d_layers": 1}  # not fp32: no fp16 or TF32 probe
    be, dev = fake_backend()
    out = gpu_probes.run(model, (x,), {}, facts, base, be, device_type="cpu")
    assert set(out) == {"cudnn_benchmark"} and dev.on is False and dev.set[:2] == [True, False]
    assert {"base_s", "new_s", "saving_s"} <= set(out["cudnn_benchmark"])
    be, _ = fake_backend(on=True)
    assert gpu_probes.run(model, (x,), {}, facts, base, be, device_type="cpu") == {}


BD = Breakdown(n=10, total_s=0.1, median_total_s=0.1, parts={"forward_s": 0.05}, syncs_per_step=0.0)


def rule(probe: dict) -> list:
    found = probe_findings([], BD, {cudnn_benchmark.PROBE: probe})
    return [f for f in found if f.id == cudnn_benchmark.FINDING]


def test_rule_helps_and_undecided_with_the_texts_it_had():
    (f,) = rule({"base_s": 0.05, "new_s": 0.03, "saving_s": 0.02, "saving_lo_s": 0.015, "saving_hi_s": 0.025})
    assert (
        f.severity is Severity.WARN
        and f.title == "cudnn.benchmark is off for a conv net with fixed input shapes"
    )
    assert f.evidence.startswith("forward+backward: benchmark off 50 ms, on 30 ms")
    assert f.fix_code == "torch.backends.cudnn.benchmark = True" and f.location is None
    assert f.fix.startswith("Let cuDNN pick the fastest convolution algorithms")
    # no pass finding: the rule has none, so a ruled-out gain says nothing
    assert (
        rule({"base_s": 0.05, "new_s": 0.05, "saving_s": 0.0, "saving_lo_s": -0.002, "saving_hi_s": 0.002})
        == []
    )
    (f,) = rule({"base_s": 0.05, "new_s": 0.049, "saving_s": 0.001})
    assert f.severity is Severity.INFO and "--candidates cudnn_benchmark" in f.fix
    assert rule({}) == []  # not probed: no finding


def test_fix_times_it_on_cuda_and_says_why_not_on_cpu():
    built, skipped = build_candidates(
        [("cudnn_benchmark", "cudnn.benchmark")], {"device": "cuda:0"}, FixConfig()
    )
    assert skipped == [] and [(c.name, c.kind, c.overrides) for c in built] == [
        ("cudnn.benchmark", "cudnn_benchmark", Overrides(cudnn_benchmark=True))
    ]
    built, skipped = build_candidates(
        [("cudnn_benchmark", "cudnn.benchmark")], {"device": "cpu"}, FixConfig()
    )
    assert built == [] and skipped == ["cudnn_benchmark: no CUDA device in this run"]


def test_profile_injects_it_on_each_models_device(monkeypatch):
    from pitstop.profile.capture.models import ModelHooks

    seen = []
    monkeypatch.setattr(cudnn_benchmark, "apply", lambda dev, on: seen.append((dev, on)) or {})
    captured = SimpleNamespace(models=[])
    for ov, want in ((Overrides(cudnn_benchmark=True), [("cpu", True)]), (Overrides(), [])):
        seen.clear()
        inst = SimpleNamespace(cfg=SimpleNamespace(overrides=ov), captured=captured, model_facts={})
        ModelHooks(inst).add_model(nn.Linear(2, 2))
        assert seen == want


SCRIPT = """import torch


def main():
    model = Net().to(device)
"""


def test_edit_puts_the_snippet_first_in_main():
    fe = FileEdits(Path("train.py"), SCRIPT, SCRIPT)
    editor = ModelEditor(fe, 0, cudnn_benchmark.KNOB, True, "cuda")
    assert cudnn_benchmark.edit(editor) == {"cudnn_benchmark": True}
    lines = fe.render().splitlines()
    at = lines.index("    torch.backends.cudnn.benchmark = True")
    assert lines[at + 1] == "    model = Net().to(device)" and lines.count("import torch") == 1
