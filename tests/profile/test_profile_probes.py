"""The exit probes on small models in this process: channels_last on a task module called as
``model(input, target)``, the autocast probe on a CPU without bf16 hardware (faked), and a failed probe
reported as a finding."""

from __future__ import annotations

import torch
from torch import nn

from pitstop.findings import Severity
from pitstop.matmul import cpu_bf16_line
from pitstop.profile.analyze.rules import findings_for
from pitstop.profile.capture.facts import model_facts
from pitstop.profile.probe import probes
from pitstop.profile.record.timeline import StepRecord


class TaskModule(nn.Module):
    """A conv net and its loss, called as ``model(images, target)``; the 1-D target and a 5-D buffer
    must stay as they are when the probe tries channels_last."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten()
        )
        self.head = nn.Linear(8, 4)
        self.register_buffer("volume", torch.zeros(1, 1, 2, 2, 2))

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        assert target.dim() == 1
        return nn.functional.cross_entropy(self.head(self.net(x)), target) + self.volume.sum()


def _facts(model: nn.Module) -> dict:
    return {**model_facts(model), "autocast": False}


def test_channels_last_probe_on_a_model_called_with_its_target(bf16less_cpu):
    torch.manual_seed(0)
    model = TaskModule()
    inputs = ((torch.randn(4, 3, 16, 16), torch.randint(0, 4, (4,))), {})
    out = probes._model_probes(model, inputs, _facts(model))
    assert "error" not in out
    cl = out["channels_last"]
    assert cl["base_s"] > 0 and cl["new_s"] > 0 and cl["saving_s"] == cl["base_s"] - cl["new_s"]
    assert model.net[0].weight.is_contiguous()  # the probe converted a copy, not the script's model
    # A CPU without bf16 hardware: no autocast pass was run, and the reason is doctor's sentence.
    assert out["precision"] == {"dtype": None, "skipped": cpu_bf16_line()}
    assert not bf16less_cpu  # not even a matmul check: the flags already say fp32


def test_autocast_probe_is_skipped_when_its_matmuls_measure_too_slow(bf16less_cpu, monkeypatch):
    from pitstop.host import cpu as hardware

    monkeypatch.setattr(hardware, "_host_flags", lambda: frozenset({"avx512_bf16"}))  # flags say fast
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))
    facts = _facts(model)
    assert probes._slow_amp("bfloat16", "cpu", 0.001) is None  # 0.3 s a pass at the measured ratio: fits
    out = probes._model_probes(model, ((torch.randn(8, 64),), {}), facts)
    assert "precision" in out
    slow = probes._slow_amp("bfloat16", "cpu", 0.05)  # ~15 s a bf16 pass: over the bound
    assert (
        slow and "bf16 torch.mm 0.301 GFLOP/s vs fp32 89 GFLOP/s" in slow and "over the probes' bound" in slow
    )
    assert max(n for dt, n, _ in bf16less_cpu if dt == "bfloat16") <= 512  # the check itself stayed small
    steps = [StepRecord(index=i, start_s=i * 0.1, total_s=0.1, forward_s=0.05) for i in range(5)]
    data = {"probes": {"precision": {"dtype": None, "skipped": slow, "slower": True}}, "models": [facts]}
    f = next(f for f in findings_for(steps, data, cores=2)[0] if f.id == "precision.amp")
    assert f.severity is Severity.INFO and f.evidence == slow


def test_a_probe_that_fails_is_a_finding_with_its_error():
    steps = [StepRecord(index=i, start_s=i * 0.1, total_s=0.1, forward_s=0.05) for i in range(5)]
    err = "model probes failed: RuntimeError: required rank 4 tensor to use channels_last format"
    data = {"probes": {"error": err, "host_memory": {"error": "OSError: no"}}, "models": [{}]}
    found = [f for f in findings_for(steps, data, cores=2)[0] if f.id == "profile.probe_failed"]
    assert [f.severity for f in found] == [Severity.INFO, Severity.INFO]
    assert found[0].evidence == err and found[0].data["error"] == err
    assert "host-memory" in found[1].title
