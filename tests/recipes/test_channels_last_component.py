"""The channels_last component (``pitstop.recipes.channels_last``): its model and input change, its facts,
its rule on synthetic probe results, its snippet and its ``fix --apply`` edit on a small script."""

from __future__ import annotations

from collections import namedtuple
from pathlib import Path

import pytest
import torch
from torch import nn

from pitstop.findings import Severity
from pitstop.fix.apply import FileEdits, ModelEditor, Unplaced
from pitstop.profile.analyze.rulekit import probe_finding
from pitstop.profile.record.timeline import Breakdown
from pitstop.recipes import channels_last, component, recipe

NHWC = torch.channels_last


def conv_net() -> nn.Module:
    net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.Flatten(), nn.LazyLinear(2))
    net.register_buffer("volume", torch.zeros(1, 1, 2, 2, 2))  # 5-D: channels_last cannot hold it
    return net


def test_apply_model_converts_4d_weights_in_place_and_leaves_the_rest():
    net = conv_net()
    params = list(net[0].parameters())
    assert channels_last.apply_model(net) is net
    w = net[0].weight
    assert w.is_contiguous(memory_format=NHWC) and not w.is_contiguous()
    assert list(net[0].parameters()) == params  # the same objects: an optimizer built before holds them
    assert net.volume.is_contiguous() and net.volume.dim() == 5
    assert channels_last.model_facts(net) == {"channels_last": True}
    mlp = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))
    before = [p.detach().clone() for p in mlp.parameters()]
    channels_last.apply_model(mlp)
    assert all(p.is_contiguous() and torch.equal(p, b) for p, b in zip(mlp.parameters(), before, strict=True))
    assert not channels_last.has_conv2d(mlp) and channels_last.has_conv2d(net)
    assert channels_last.model_facts(mlp) == {"channels_last": False}


def test_apply_input_converts_4d_floating_tensors_in_any_container():
    x, y = torch.randn(2, 3, 8, 8), torch.randint(0, 4, (2,))
    ids = torch.zeros(2, 3, 8, 8, dtype=torch.long)
    Batch = namedtuple("Batch", "x y")
    out = channels_last.apply_input([Batch(x, y), {"img": x, "ids": ids, "n": 3}])
    assert isinstance(out[0], Batch) and out[0].x.is_contiguous(memory_format=NHWC) and out[0].y is y
    assert out[1]["img"].is_contiguous(memory_format=NHWC) and not out[1]["img"].is_contiguous()
    assert out[1]["ids"] is ids and out[1]["n"] == 3
    assert torch.equal(out[0].x, x) and x.is_contiguous()  # values equal, the caller's tensor untouched
    assert channels_last.input_in_use([y, out[0].x]) and not channels_last.input_in_use([x, y])


def test_applies_and_cannot_help_read_the_recorded_facts():
    assert channels_last.applies({"conv2d_layers": 2, "channels_last": False})
    assert not channels_last.applies({"conv2d_layers": 2, "channels_last": True})
    assert not channels_last.applies({"conv2d_layers": 0})
    flat = {"conv2d_layers": 0, "input_shapes": [[8, 32]]}
    assert "nothing to change" in (channels_last.cannot_help([flat]) or "")
    assert channels_last.cannot_help([flat, {"conv2d_layers": 0, "input_shapes": [[8, 3, 4, 4]]}]) is None
    assert channels_last.cannot_help([]) is None  # nothing recorded: fix measures it anyway


def test_the_registry_entry_points_at_the_component():
    r = recipe("channels_last")
    assert component("channels_last") is channels_last and r.component == channels_last.__name__
    assert r.snippet == channels_last.SNIPPET and "torch.channels_last" in r.code()
    assert component("static_graph") is None  # an entry without a component of its own


BD = Breakdown(n=10, total_s=0.1, median_total_s=0.1, parts={"forward_s": 0.05}, syncs_per_step=0.0)


def rule(probe: dict) -> list:
    fields = {"conv2d_layers": 3, "bar": "5%"}
    return probe_finding(channels_last.RULE, BD, {channels_last.PROBE: probe}, "train.py:9", **fields)


def test_rule_helps_no_gain_hurts_and_undecided():
    helps = {"base_s": 0.05, "new_s": 0.03, "saving_s": 0.02, "saving_lo_s": 0.015, "saving_hi_s": 0.025}
    (f,) = rule(helps)
    assert f.id == channels_last.FINDING and f.severity is Severity.WARN and abs(f.share - 0.2) < 1e-9
    assert (
        f.location == "train.py:9" and "3 Conv2d layers" in f.evidence and f.fix_code == channels_last.SNIPPET
    )
    # no gain, its interval's upper bound (2 ms) under 5% of the 100 ms step: a pass
    (f,) = rule(
        {"base_s": 0.05, "new_s": 0.0505, "saving_s": -0.0005, "saving_lo_s": -0.003, "saving_hi_s": 0.002}
    )
    assert f.severity is Severity.PASS and f.data["verdict"] == "no gain"
    # slower with channels_last, decided by its interval: a pass too (nothing to fix)
    hurts = {"base_s": 0.05, "new_s": 0.06, "saving_s": -0.01, "saving_lo_s": -0.012, "saving_hi_s": -0.008}
    (f,) = rule(hurts)
    assert f.severity is Severity.PASS and f.data["saving_ci_s"] == [-0.012, -0.008]
    # the same without an interval, or with one reaching the 5 ms bar: undecided, naming fix's run
    for probe in ({**hurts, "saving_lo_s": None, "saving_hi_s": None}, {**hurts, "saving_hi_s": 0.006}):
        (f,) = rule(probe)
        assert f.severity is Severity.INFO and f.data["verdict"] == "undecided"
        assert "--candidates channels_last" in f.fix
    assert rule({}) == []  # not probed: no finding


SCRIPT = """import torch


def main():
    model = Net().to(device)
    for data, target in loader:
        data, target = data.to(device), target.to(device)
        loss = criterion(model(data), target)
        loss.backward()
"""


def edited(text: str, needle: str) -> str:
    fe = FileEdits(Path("train.py"), text, text)
    where = next(i + 1 for i, ln in enumerate(text.splitlines()) if needle in ln)
    channels_last.edit(ModelEditor(fe, where, channels_last.NAME))
    return fe.render()


def test_edit_converts_the_model_after_its_line_and_the_input_after_its_move():
    lines = edited(SCRIPT, "model(data)").splitlines()
    m = lines.index("    model = model.to(memory_format=torch.channels_last)")
    assert lines[m - 1] == "    model = Net().to(device)"
    x = lines.index("        data = data.to(memory_format=torch.channels_last)")
    assert lines[x - 1] == "        data, target = data.to(device), target.to(device)"
    assert len(lines) == len(SCRIPT.splitlines()) + 2 and lines[0] == "import torch"


def test_edit_without_a_move_goes_before_the_forward_and_adds_the_import():
    text = SCRIPT.replace("import torch\n", "").replace(
        "        data, target = data.to(device), target.to(device)\n", ""
    )
    lines = edited(text, "model(data)").splitlines()
    x = lines.index("        data = data.to(memory_format=torch.channels_last)")
    assert lines[x + 1] == "        loss = criterion(model(data), target)"
    assert "import torch" in lines


def test_edit_refuses_an_input_that_is_not_a_plain_name():
    text = SCRIPT.replace("model(data)", "model(data[0])")
    with pytest.raises(Unplaced, match="first input is not a plain variable"):
        edited(text, "model(data[0])")
