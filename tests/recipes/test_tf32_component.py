"""The TF32 component (``pitstop.recipes.tf32``): its process-wide setting (CUDA only), the probe's arms on a
fake device, its rule on synthetic probe results, fix's candidate (and why none on CPU), bench's row, the
profile injection and its ``fix --apply`` edit on a small script."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from pitstop.bench.configs import BASELINE, ablation, why_not
from pitstop.findings import Severity
from pitstop.fix.apply import FileEdits, ModelEditor
from pitstop.fix.core import FixConfig, build_candidates
from pitstop.profile.analyze.gpu_rules import probe_findings
from pitstop.profile.record.overrides import Overrides
from pitstop.profile.record.timeline import Breakdown
from pitstop.recipes import component, components, recipe, tf32
from pitstop.recipes.component import PROCESS
from pitstop.recipes.knobs import Knobs


@pytest.fixture
def torch_settings():
    """The process's TF32 settings restored after the test."""
    saved = (
        torch.backends.cuda.matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
        torch.get_float32_matmul_precision(),
    )
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved[:2]
    torch.set_float32_matmul_precision(saved[2])


def test_the_registry_entry_takes_its_names_from_the_module():
    r = recipe("tf32")
    assert component("tf32") is tf32 and tf32 in components(PROCESS)
    assert (r.snippet, r.finding, r.probe, r.override) == (tf32.SNIPPET, tf32.FINDING, tf32.PROBE, tf32.KNOB)
    assert r.train == "TrainConfig.tf32" and r.bench == (("tf32", "TF32 matmuls"),)
    assert Overrides.setting(r.override, True) == Overrides(tf32=True) and not Knobs().tf32


def test_apply_sets_tf32_on_cuda_only_and_scoped_restores_it(torch_settings):
    assert tf32.apply("cpu", True) == {}
    assert torch.get_float32_matmul_precision() == "highest" and not torch.backends.cuda.matmul.allow_tf32
    assert tf32.apply("cuda", True) == {"tf32": True}
    assert torch.get_float32_matmul_precision() == "high"
    assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
    assert tf32.apply("cuda", False) == {"tf32": False}
    assert torch.get_float32_matmul_precision() == "highest" and not torch.backends.cudnn.allow_tf32
    with tf32.scoped("cuda", True):
        assert torch.get_float32_matmul_precision() == "high"
    assert torch.get_float32_matmul_precision() == "highest" and not torch.backends.cudnn.allow_tf32
    with tf32.scoped("cpu", True):
        assert torch.get_float32_matmul_precision() == "highest"


class FakeDevice:
    """A GPU's capability and matmul precision (``component.DeviceSettings``), recording what was set."""

    def __init__(self, cap: tuple[int, int] = (8, 0), precision: str = "highest") -> None:
        self.cap, self.precision, self.set = cap, precision, []

    def capability(self) -> tuple[int, int]:
        return self.cap

    def get_matmul_precision(self) -> str:
        return self.precision

    def set_matmul_precision(self, p: str) -> None:
        self.precision = p
        self.set.append(p)


def test_probe_applies_to_an_fp32_model_on_ampere_left_at_highest_and_its_arm_restores():
    fp32 = {"param_dtypes": ["float32"]}
    assert tf32.applies(fp32, FakeDevice())
    assert not tf32.applies(fp32, FakeDevice((7, 5)))  # Turing: no TF32
    assert not tf32.applies(fp32, FakeDevice(precision="high"))  # the script allows it already
    assert not tf32.applies({"param_dtypes": ["bfloat16"]}, FakeDevice())
    assert not tf32.applies({**fp32, "autocast": True}, FakeDevice())
    dev, seen = FakeDevice(), []
    tf32.changed(lambda: seen.append(dev.precision), dev)()
    assert seen == ["high"] and dev.set == ["high", "highest"] and dev.precision == "highest"


BD = Breakdown(n=10, total_s=0.1, median_total_s=0.1, parts={"forward_s": 0.05}, syncs_per_step=0.0)


def rule(probe: dict) -> list:
    return [f for f in probe_findings([], BD, {tf32.PROBE: probe}) if f.id == tf32.FINDING]


def test_rule_helps_no_gain_and_undecided():
    (f,) = rule({"base_s": 0.05, "new_s": 0.03, "saving_s": 0.02, "saving_lo_s": 0.015, "saving_hi_s": 0.025})
    assert f.severity is Severity.WARN and f.title == tf32.RULE.title and f.fix_code == tf32.SNIPPET
    assert "'highest' 50 ms, 'high' (TF32) 30 ms" in f.evidence and f.location is None
    (f,) = rule({"base_s": 0.05, "new_s": 0.05, "saving_s": 0.0, "saving_lo_s": -0.002, "saving_hi_s": 0.002})
    assert f.severity is Severity.PASS and f.title == tf32.RULE.pass_title
    (f,) = rule({"base_s": 0.05, "new_s": 0.049, "saving_s": 0.001})
    assert f.severity is Severity.INFO and f.data["verdict"] == "undecided" and "--candidates tf32" in f.fix
    assert rule({}) == []  # not probed: no finding


def test_fix_times_it_on_cuda_and_says_why_not_on_cpu():
    built, skipped = build_candidates([("tf32", "precision.tf32")], {"device": "cuda:0"}, FixConfig(), {})
    assert skipped == [] and [(c.name, c.overrides) for c in built] == [("tf32", Overrides(tf32=True))]
    built, skipped = build_candidates([("tf32", "requested")], {"device": "cpu"}, FixConfig())
    assert built == [] and skipped == [tf32.cannot_help("cpu", {})]
    assert "no CUDA device" in skipped[0]
    data = {"torch": {"float32_matmul_precision": "high", "tf32_matmul": True}}
    built, skipped = build_candidates([("tf32", "requested")], {"device": "cuda"}, FixConfig(), data)
    assert built == [] and "allows TF32 matmuls already" in skipped[0]


def test_bench_has_a_tf32_row_on_cuda_only():
    rows = {c.name: c for c in ablation("cuda", False, "bfloat16")}
    assert rows["tf32"].tf32 and rows["tf32"].knobs() == "TF32 matmuls" and not rows["all"].tf32
    assert "tf32" not in {c.name for c in ablation("cpu", False, "bfloat16")}
    assert "no CUDA device" in (why_not(rows["tf32"], "cpu", False) or "")
    assert why_not(rows["tf32"], "cuda", True) is None and not BASELINE.tf32


def test_bench_session_sets_it_around_each_step_only(torch_settings, monkeypatch):
    from pitstop.bench import session as session_mod
    from pitstop.bench.workloads import WorkloadSpec, build_workload

    seen = []
    wl = build_workload(WorkloadSpec("tabular", "tiny", batch_size=4))
    monkeypatch.setattr(tf32, "apply", lambda dev, on: seen.append((dev, on)) or {})
    config = next(c for c in ablation("cuda", False, None) if c.name == "tf32")
    s = session_mod.Session(wl, config, "cpu")
    s.step()
    s.close()
    assert seen == [("cpu", True)]  # applied on the session's device (a no-op off CUDA), per step
    base = session_mod.Session(wl, BASELINE, "cpu")
    base.step()
    base.close()
    assert seen == [("cpu", True)]


def test_profile_injects_it_on_each_models_device(torch_settings, monkeypatch):
    from types import SimpleNamespace

    from pitstop.profile.capture.models import ModelHooks

    seen = []
    monkeypatch.setattr(tf32, "apply", lambda dev, on: seen.append((dev, on)) or {})
    captured = SimpleNamespace(models=[])
    for ov, want in ((Overrides(tf32=True), [("cpu", True)]), (Overrides(), [])):
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
    assert tf32.edit(ModelEditor(fe, 0, tf32.KNOB, True, "cuda")) == {"tf32": True}
    lines = fe.render().splitlines()
    at = lines.index('    torch.set_float32_matmul_precision("high")')
    assert lines[at + 1] == "    torch.backends.cudnn.allow_tf32 = True"
    assert lines[at + 2] == "    model = Net().to(device)" and lines.count("import torch") == 1
    bare = "x = 1\n"
    fe = FileEdits(Path("t.py"), bare, bare)
    tf32.edit(ModelEditor(fe, 0, tf32.KNOB, True))
    assert fe.render().splitlines()[:3] == ["import torch", 'torch.set_float32_matmul_precision("high")',
                                           "torch.backends.cudnn.allow_tf32 = True"]  # fmt: skip
