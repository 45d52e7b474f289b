"""The float32 component (``pitstop.recipes.float32``): the model, its inputs and its outputs converted, the
rule on synthetic probe results (and its info finding where the probe did not run), the probe through the
component, fix's candidate, the profile injection (not for ``model.forward(x)``) and its ``fix --apply`` edit
on a small script."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import torch
from torch import nn

from pitstop.findings import Severity
from pitstop.fix.apply import FileEdits, ModelEditor
from pitstop.fix.core import FixConfig, build_candidates
from pitstop.profile.analyze.rules_compute import dtype_rules
from pitstop.profile.record.overrides import Overrides
from pitstop.profile.record.timeline import Breakdown
from pitstop.recipes import component, components, float32, recipe
from pitstop.recipes.component import DTYPE
from pitstop.recipes.knobs import Knobs
from pitstop.train import float32 as train_float32


def test_the_registry_entry_takes_its_names_from_the_module():
    r = recipe("float32")
    assert component("float32") is float32 and components(DTYPE) == [float32]
    assert (r.snippet, r.finding, r.probe, r.override) == (
        float32.SNIPPET,
        "precision.float64",
        "float32",
        "float32",
    )
    assert r.apply == "pitstop.fix.apply.apply_component" and not Knobs().float32
    assert train_float32.float32_model is float32.apply_model  # train serves the component's functions


def test_model_inputs_and_outputs_convert_only_their_float64_tensors():
    model = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2)).double()
    model[0].weight.grad = torch.zeros(2, 2, dtype=torch.float64)
    assert float32.has_float64(model) and float32.apply_model(model) is model
    assert not float32.has_float64(model) and model[0].weight.grad.dtype == torch.float32
    assert model[1].num_batches_tracked.dtype == torch.long
    x, i = torch.zeros(2, dtype=torch.float64), torch.zeros(2, dtype=torch.long)
    args, kw = float32.apply_input(((x, i), {"y": [x]}))
    assert (args[0].dtype, args[1].dtype, kw["y"][0].dtype) == (torch.float32, torch.long, torch.float32)
    out = float32.apply_output({"a": torch.zeros(1), "b": torch.zeros(1, dtype=torch.float16)})
    assert (out["a"].dtype, out["b"].dtype) == (torch.float64, torch.float16)


MODEL = {"param_dtypes": ["float64"], "first_location": "train.py:9"}
BD = Breakdown(n=10, total_s=0.1, median_total_s=0.1, parts={"forward_s": 0.05}, syncs_per_step=0.0)


def test_rule_helps_no_gain_and_unprobed():
    assert float32.applies(MODEL) and not float32.applies({"param_dtypes": ["float32"]})
    assert dtype_rules(BD, {"param_dtypes": ["float32"]}, {}) == []
    probe = {"dtype": "float32", "base_s": 0.08, "new_s": 0.04, "saving_s": 0.04, "saving_lo_s": 0.03}
    (f,) = dtype_rules(BD, MODEL, {"float32": {**probe, "saving_hi_s": 0.05}})
    assert f.severity is Severity.WARN and f.title == float32.RULE.title and f.location == "train.py:9"
    assert f.fix_code == float32.SNIPPET
    (f,) = dtype_rules(BD, MODEL, {"float32": {"dtype": "float32", "skipped": "model too large"}})
    assert f.severity is Severity.INFO and f.title == "The model trains in float64"
    assert "(model too large). `pitstop fix --candidates float32` measures it" in f.evidence
    assert f.data == {
        "param_dtypes": ["float64"],
        "probe": {"dtype": "float32", "skipped": "model too large"},
    }
    (f,) = dtype_rules(BD, MODEL, {"error": "boom"})
    assert "(boom)" in f.evidence and f.data["probe"] is None and f.location == "train.py:9"


def test_the_probe_changes_a_copy_through_the_component(monkeypatch):
    from pitstop.profile.probe import probe_float64

    seen = []
    monkeypatch.setattr(float32, "apply_model", lambda m: seen.append("model") or m.float())
    model = nn.Linear(2, 1).double()
    x = torch.zeros(3, 2, dtype=torch.float64)

    def base() -> None:
        model(x).sum().backward()

    out = probe_float64.run(float32, model, (x,), {}, {"param_bytes": 16}, base, "cpu")
    assert seen == ["model"] and out["dtype"] == "float32" and {"base_s", "new_s", "saving_s"} <= set(out)
    assert model.weight.dtype == torch.float64  # the script's model as it was
    big = probe_float64.run(float32, model, (x,), {}, {"param_bytes": 2**40}, base, "cpu")
    assert big == {"dtype": "float32", "skipped": "model too large to copy for the probe"}


def test_fix_builds_its_switch():
    built, skipped = build_candidates([("float32", "precision.float64")], {"device": "cpu"}, FixConfig())
    assert skipped == [] and [(c.kind, c.overrides) for c in built] == [("float32", Overrides(float32=True))]


def test_profile_injects_it_except_into_a_model_called_as_forward():
    from pitstop.profile.capture.models import ModelHooks

    captured = SimpleNamespace(models=[])
    inst = SimpleNamespace(
        cfg=SimpleNamespace(overrides=Overrides(float32=True)), captured=captured, model_facts={}
    )
    hooks = ModelHooks(inst)
    assert hooks.dtype == [float32] and hooks.on_inputs and hooks.on_outputs is True
    model, direct = nn.Linear(2, 2).double(), nn.Linear(2, 2).double()
    hooks.add_model(model)
    hooks.direct_ids.add(id(direct))
    hooks.add_model(direct)
    assert model.weight.dtype == torch.float32 and direct.weight.dtype == torch.float64
    off = ModelHooks(
        SimpleNamespace(cfg=SimpleNamespace(overrides=Overrides()), captured=captured, model_facts={})
    )
    assert off.dtype == [] and not off.on_inputs and off.on_outputs is not True


SCRIPT = """import torch


def main():
    model = Net().double()
    x_all = load()
    for idx in batches:
        x = x_all[idx].to(device)
        loss = model(x).sum()
        out = model(x_all[idx])
"""


def test_edit_converts_the_model_and_its_input_or_the_indexed_tensor():
    fe = FileEdits(Path("train.py"), SCRIPT, SCRIPT)
    assert float32.edit(ModelEditor(fe, 9, float32.KNOB, True)) == {"float32": True}
    lines = fe.render().splitlines()
    assert lines[lines.index("    model = Net().double()") + 1] == "    model = model.float()"
    assert lines[lines.index("        x = x_all[idx].to(device)") + 1] == "        x = x.float()"
    fe = FileEdits(Path("train.py"), SCRIPT, SCRIPT)
    float32.edit(ModelEditor(fe, 10, float32.KNOB, True))
    lines = fe.render().splitlines()
    assert lines[lines.index("    x_all = load()") + 1] == "    x_all = x_all.float()"
