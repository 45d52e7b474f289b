"""Forwards timed from the models' classes' ``__call__`` once the warm-up is over, with the global module
hooks gone (a DDP model, a plain one, two models, a DDP subclass with a forward of its own); the hooks are
kept where an input override is on, a part of a model is called on its own, or a model is called as
``model.forward(x)``.

Each case runs in its own process (a gloo world of one): a process group outlives a test otherwise.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SCRIPT = textwrap.dedent(
    """
    import gc, json, sys, tempfile
    from pathlib import Path
    import torch, torch.distributed as dist
    from torch import nn
    from torch.nn.modules import module as _module
    from pitstop.profile.capture.hooks import Config, Instrumentation
    from pitstop.profile.record.overrides import Overrides

    torch.set_num_threads(1)
    case = sys.argv[1]

    class OwnForward(nn.parallel.DistributedDataParallel):
        def forward(self, x):
            return self.module(x)

    tmp = Path(tempfile.mkdtemp())
    dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=0, world_size=1)
    DDP = nn.parallel.DistributedDataParallel
    orig_forward = DDP.forward
    ov = Overrides(autocast="bfloat16") if case == "autocast" else Overrides()
    inst = Instrumentation(Config(steps=100, warmup=2, full=True, out_dir=tmp, overrides=ov))
    inst.install()
    wrap = OwnForward if case == "own_forward" else DDP
    net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    model = net if case in ("plain", "part", "direct") else wrap(net)
    wrap = type(model)
    other = nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(16, 8), torch.randint(0, 2, (16,))
    out = {}
    for i in range(8):
        if case == "other":
            other(x)
        if case == "raises" and i == 5:
            try:
                model(torch.randn(16, 3))
            except RuntimeError:
                out["raised"] = True
        loss = nn.functional.cross_entropy(model.forward(x) if case == "direct" else model(x), y)
        if case == "part":  # a part of the model found, called on its own
            net[0](x)
        opt.zero_grad()
        loss.backward()
        opt.step()
    out["global_hooks"] = len(_module._global_forward_pre_hooks) + len(_module._global_forward_hooks)
    out["call_patched"] = "__call__" in wrap.__dict__
    inst.close_pending()
    out["forward_ms"] = [r["forward_s"] * 1000 for r in inst.records if not r["warmup"]]
    out["forwards"] = inst.counts["forwards"]
    out["models"] = len(inst.captured.models)
    out["last_inputs"] = inst.captured.last_inputs is not None
    inst.uninstall()
    out["after_uninstall"] = ["__call__" not in wrap.__dict__ and DDP.forward is orig_forward,
                              len(_module._global_forward_pre_hooks) + len(_module._global_forward_hooks)]
    print(json.dumps(out))
    del model, opt
    gc.collect()
    dist.destroy_process_group()
    """
)


def run_case(case: str, tmp_path: Path) -> dict:
    script = tmp_path / "ddp_forward_case.py"
    script.write_text(SCRIPT)
    src = Path(__file__).resolve().parents[2] / "src"
    p = subprocess.run(
        [sys.executable, str(script), case],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(src), "PATH": "/usr/bin:/bin"},
    )
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("case", ["ddp", "plain", "other", "own_forward"])
def test_forwards_are_timed_from_the_models_classes_once_the_hooks_are_gone(case, tmp_path):
    out = run_case(case, tmp_path)
    assert out["global_hooks"] == 0 and out["call_patched"]
    assert len(out["forward_ms"]) == 6 and all(ms > 0 for ms in out["forward_ms"])
    assert out["forwards"] == (16 if case == "other" else 8)
    assert out["models"] == (2 if case == "other" else 1) and out["last_inputs"]
    assert out["after_uninstall"] == [True, 0]


def test_a_forward_that_raises_ends_its_phase_and_the_next_steps_are_timed(tmp_path):
    out = run_case("raises", tmp_path)
    assert out["raised"] and out["call_patched"]
    assert len(out["forward_ms"]) == 6 and all(ms > 0 for ms in out["forward_ms"])
    assert out["after_uninstall"] == [True, 0]


@pytest.mark.parametrize("case", ["autocast", "part", "direct"])
def test_hooks_stay_for_an_input_override_a_part_called_alone_or_a_direct_forward(case, tmp_path):
    out = run_case(case, tmp_path)
    assert out["global_hooks"] == 2 and not out["call_patched"]
    assert all(ms > 0 for ms in out["forward_ms"])
    assert out["after_uninstall"] == [True, 0]
