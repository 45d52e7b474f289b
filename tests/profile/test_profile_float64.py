"""float64 training: the float32 probe, its finding (warning, pass, or untimed info) and the float32
override pitstop fix injects."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from pitstop.findings import Severity
from pitstop.profile.analyze.rules import findings_for
from pitstop.profile.probe.probes import run_probes
from pitstop.profile.record.overrides import Overrides
from pitstop.profile.record.timeline import StepRecord

torch.set_num_threads(1)
MODEL = {"param_dtypes": ["float64"], "first_location": "train.py:9", "param_bytes": 8000}


def steps(n=10, total=0.1, **parts) -> list[StepRecord]:
    return [StepRecord(index=i, start_s=i * total, total_s=total, **parts) for i in range(n)]


def _float64(probe: dict | None) -> list:
    data = {"models": [MODEL], "probes": {"float32": probe} if probe else {}}
    found, _ = findings_for(steps(forward_s=0.03, backward_s=0.05), data, cores=2)
    return [f for f in found if f.id == "precision.float64"]


def test_a_confirmed_float32_gain_is_a_warning_at_the_model():
    probe = {"dtype": "float32", "base_s": 0.08, "new_s": 0.04, "saving_s": 0.04}
    probe.update(saving_lo_s=0.03, saving_hi_s=0.05)
    (f,) = _float64(probe)
    assert f.severity is Severity.WARN and f.location == "train.py:9"
    assert abs(f.est_saving_s - 0.04) < 1e-12 and f.data["saving_ci_s"] == [0.03, 0.05]
    assert "model.float()" in f.fix_code


def test_float32_no_faster_is_a_pass_only_on_a_deciding_interval_and_an_unmeasured_gain_is_info():
    no_gain = {"dtype": "float32", "base_s": 0.08, "new_s": 0.081, "saving_s": -0.001}
    (same,) = _float64({**no_gain, "saving_lo_s": -0.003, "saving_hi_s": 0.001})  # under 5% of the step
    assert same.severity is Severity.PASS
    (loose,) = _float64(no_gain)  # no interval: a gain is not ruled out
    assert loose.severity is Severity.INFO and "--candidates float32" in loose.fix
    (skipped,) = _float64({"dtype": "float32", "skipped": "model too large to copy for the probe"})
    assert skipped.severity is Severity.INFO and "too large" in skipped.evidence
    assert "--candidates float32" in skipped.evidence
    (none,) = _float64(None)
    assert none.severity is Severity.INFO


def _f64_model() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)).double()


def test_the_probe_times_float64_against_a_float32_copy():
    from pitstop.profile.capture.facts import model_facts

    model = _f64_model()
    facts = model_facts(model)
    assert facts["param_dtypes"] == ["float64"]
    out = run_probes(model, ((torch.randn(4, 8, dtype=torch.float64),), {}), facts, [])
    p = out["float32"]
    assert p["dtype"] == "float32" and p["base_s"] > 0 and p["new_s"] > 0 and "interval" in p
    assert all(t.dtype == torch.float64 for t in model.parameters())  # the script's model as it was


@pytest.mark.parametrize("with_autocast", [False, True])
def test_the_float32_override_trains_a_float64_script(instrument, with_autocast):
    ov = Overrides(float32=True, autocast="bfloat16" if with_autocast else None)
    inst = instrument(overrides=ov)
    model = _f64_model()
    opt = torch.optim.Adam(model.parameters())
    x, y = torch.randn(16, 8, dtype=torch.float64), torch.randn(16, 1, dtype=torch.float64)
    for _ in range(3):
        out = model(x)
        assert out.dtype == torch.float64  # what follows the forward sees the script's dtype
        loss = nn.functional.mse_loss(out, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert all(s["exp_avg"].dtype == torch.float32 for s in opt.state.values())
    assert len(inst.records) >= 2 and not inst.override_errors
