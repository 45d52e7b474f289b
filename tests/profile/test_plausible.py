"""Plausible by construction: a finding never claims more than its events cost in isolation, nor more
than the part of the step it lives in. Synthetic measurements, no child process."""

from __future__ import annotations

import mmap

import pytest

from pitstop.findings import Severity
from pitstop.host import event_costs
from pitstop.profile.analyze.rules import findings_for
from pitstop.profile.record.timeline import StepRecord


def steps(n=10, total=0.1, **parts) -> list[StepRecord]:
    return [StepRecord(index=i, start_s=i * total, total_s=total, **parts) for i in range(n)]


def by_id(found, fid):
    return next(f for f in found if f.id == fid)


def test_fresh_pages_fault_once_each_and_the_cost_is_cached():
    _, _, faults = event_costs._fault_in(b"\x01" * (256 * mmap.PAGESIZE))
    assert faults >= 128  # every page of a fresh mapping faults on its first write (4 KiB pages)
    assert event_costs.page_fault_s() is event_costs.page_fault_s()
    assert event_costs.page_fault_bound_s(2e-6) == pytest.approx(event_costs.FAULT_COST_MULTIPLE * 2e-6)
    assert event_costs.page_fault_bound_s(None) is None


def test_a_fault_is_charged_at_most_a_multiple_of_its_isolated_cost():
    # 450 ms saved over 3,000 faults in the probe: 150 us a fault, where one costs 2 us in isolation
    hm = {"base_s": 0.5, "new_s": 0.05, "saving_s": 0.45, "base_faults": 3000, "new_faults": 0}
    data = {"probes": {"host_memory": {**hm, "isolated_fault_s": 2e-6}}}
    f = by_id(
        findings_for(steps(total=0.5, forward_s=0.4, minor_faults=3000), data, cores=2)[0], "host.page_faults"
    )
    bound = event_costs.FAULT_COST_MULTIPLE * 2e-6
    assert f.est_saving_s == pytest.approx(bound * 3000)  # 30 ms, not 450
    assert f.data["per_fault_s"] == pytest.approx(bound)
    assert "150.0 us per fault" in f.evidence and "not explained by faults" in f.evidence
    assert "(420 ms)" in f.evidence  # the rest of the probe's difference
    # without a calibration the probe's own price stands
    f = by_id(
        findings_for(
            steps(total=0.5, forward_s=0.4, minor_faults=3000), {"probes": {"host_memory": hm}}, cores=2
        )[0],
        "host.page_faults",
    )
    assert f.est_saving_s == pytest.approx(0.45) and "not explained" not in f.evidence


def test_fresh_runs_page_fault_saving_is_bounded_by_the_faults_too():
    two = {
        "base_s": 0.5,
        "new_s": 0.1,
        "saving_s": 0.4,
        "saving_lo_s": 0.35,
        "saving_hi_s": 0.45,
        "rounds": 4,
    }
    hm = {
        "base_s": 0.5,
        "new_s": 0.45,
        "saving_s": 0.05,
        "base_faults": 3000,
        "new_faults": 0,
        "isolated_fault_s": 2e-6,
        "two_process": two,
    }
    found, _ = findings_for(
        steps(total=0.5, forward_s=0.4, minor_faults=2000), {"probes": {"host_memory": hm}}, cores=2
    )
    f = by_id(found, "host.page_faults")
    limit = event_costs.FAULT_COST_MULTIPLE * 2e-6 * 2000
    assert f.est_saving_s == pytest.approx(limit) and f.data["capped"]["from_s"] == pytest.approx(0.4)
    assert f.data["saving_ci_s"] == pytest.approx([limit, limit])
    assert f.severity is Severity.INFO  # 20 ms of a 500 ms step: under the 5% bar once bounded
    assert "capped at 5x what its 2,000 faults per step cost" in f.evidence


def test_a_probe_saving_is_capped_at_the_forward_backward_part():
    # the probe (after the run, under load) measured 60 ms saved; the run's forward+backward is 30 ms
    p = {"base_s": 0.1, "new_s": 0.04, "saving_s": 0.06, "saving_lo_s": 0.05, "saving_hi_s": 0.07}
    data = {"models": [{"param_dtypes": ["float32"], "conv2d_layers": 3}], "probes": {"channels_last": p}}
    found, _ = findings_for(steps(forward_s=0.01, backward_s=0.02, data_wait_s=0.06), data, cores=2)
    f = by_id(found, "memory_format.channels_last")
    assert f.est_saving_s == pytest.approx(0.03) and f.share == pytest.approx(0.3)
    assert f.data["capped"] == {
        "from_s": pytest.approx(0.06),
        "to_s": pytest.approx(0.03),
        "at": "the forward + backward",
    }
    assert f.data["saving_ci_s"] == pytest.approx([0.03, 0.03])
    assert "capped at the forward + backward (30 ms per step)" in f.evidence
    assert f.severity is Severity.WARN  # still 30% of the step, confirmed
    # inside the part: untouched
    found, _ = findings_for(steps(forward_s=0.04, backward_s=0.04), data, cores=2)
    f = by_id(found, "memory_format.channels_last")
    assert f.est_saving_s == pytest.approx(0.06) and "capped" not in f.data


def test_a_cap_below_the_bar_makes_a_warning_info():
    p = {
        "type": "AdamW",
        "base_s": 0.05,
        "new_s": 0.01,
        "saving_s": 0.04,
        "saving_lo_s": 0.03,
        "saving_hi_s": 0.05,
    }
    data = {
        "optimizers": [{"type": "AdamW", "impl": "for-loop", "params": 40, "location": "train.py:5"}],
        "probes": {"optimizer": [p]},
    }
    found, _ = findings_for(steps(forward_s=0.05, optimizer_s=0.004), data, cores=2)
    f = by_id(found, "optimizer.foreach")
    assert f.est_saving_s == pytest.approx(0.004) and f.severity is Severity.INFO
    assert "capped at the optimizer" in f.evidence


def test_data_wait_finding_never_exceeds_the_data_wait():
    # fresh runs with workers measured 80 ms saved a step; the data wait is 50 ms
    two = {
        "base_s": 0.1,
        "new_s": 0.02,
        "saving_s": 0.08,
        "saving_lo_s": 0.07,
        "saving_hi_s": 0.09,
        "rounds": 4,
    }
    ld = {"location": "t.py:3", "num_workers": 0, "batches_seen": 10, "wait_s": 0.5, "batches_per_epoch": 100}
    data = {"loaders": [ld], "workers_two_process": two}
    found, _ = findings_for(steps(data_wait_s=0.05, forward_s=0.03), data, cores=4)
    f = by_id(found, "dataloader.workers")
    assert f.est_saving_s == pytest.approx(0.05) and f.data["capped"]["from_s"] == pytest.approx(0.08)
    assert "capped at the data wait (50 ms per step)" in f.evidence


# ------------------------------------------------------------------------------------------------ MFU

SAMPLING_SCRIPT = """
import torch
from torch import nn


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(32, 64)
        self.head = nn.Linear(64, 32)

    def forward(self, idx):
        return self.head(self.emb(idx))

    @torch.no_grad()
    def generate(self, idx, n):
        for _ in range(n):  # one forward per new token, as nanoGPT's sampler does
            nxt = self(idx[:, -4:])[:, -1].argmax(-1, keepdim=True)
            idx = torch.cat([idx, nxt], 1)
        return idx


model = Tiny()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(40):
    x = torch.randint(0, 32, (8, 16))
    loss = nn.functional.cross_entropy(model(x).flatten(0, 1), x.flatten())
    loss.backward()
    opt.step()
    opt.zero_grad()
    if step % 3 == 0:  # the trainer's sampling callback: no-grad generate, then an eval-mode forward
        model.eval()
        model.generate(x[:1, :4], 12)
        with torch.inference_mode():
            model(x)
        model(x)  # eval mode, grad on: still not a training pass
        model.train()
"""


@pytest.mark.slow
def test_mfu_counts_training_passes_only_with_a_sampling_callback(tmp_path):
    import json
    import subprocess
    import sys
    from pathlib import Path

    script = tmp_path / "sampling.py"
    script.write_text(SAMPLING_SCRIPT)
    report = tmp_path / "r.json"
    cmd = [sys.executable, "-m", "pitstop", "profile", "--steps", "12", "--warmup", "2", "--quiet"]
    cmd += ["--json", str(report), "--", "python", str(script)]
    subprocess.run(
        cmd, cwd=Path(__file__).resolve().parents[2], capture_output=True, timeout=300, check=False
    )
    rep = json.loads(report.read_text())
    totals = rep["sections"]["totals"]
    assert totals["forwards"] > 3 * totals["train_forwards"]  # the callback's forwards ran and were seen
    sec = rep["sections"]["mfu"]
    assert sec["passes_per_step"] == 1  # one training forward+backward a step, not the callback's 15
    assert (sec["mfu"] is None) == ("inconsistent" in sec)  # never a utilisation over 100%
    assert sec["mfu"] is None or 0 < sec["mfu"] <= 1


def test_mfu_over_100_percent_is_flagged_not_reported():
    from pitstop.profile.analyze.gpu_rules import mfu_findings
    from pitstop.profile.probe import mfu

    m = {
        "flops_per_pass": 2e9,
        "dtype": "float32",
        "device": "cpu",
        "peak_flops_per_s": 1e11,
        "peak_size": 256,
    }
    sec = mfu.section(m, median_step_s=0.01, passes_per_step=1)  # 200 GFLOP/s against a 100 GFLOP/s peak
    assert sec["mfu"] is None and "200%" in sec["inconsistent"]
    (f,) = mfu_findings(sec)
    assert f.id == "compute.mfu" and f.severity is Severity.INFO and "not reported" in f.title
    ok = mfu.section(m, median_step_s=0.04, passes_per_step=1)
    assert ok["mfu"] == pytest.approx(0.5) and "inconsistent" not in ok
    # passes: training forwards per step; the no-grad and eval forwards a callback adds are not passes
    assert mfu.passes_per_step({"forwards": 180, "train_forwards": 12}, 12) == 1
    assert mfu.passes_per_step({"forwards": 24}, 12) == 2  # a record from before train_forwards
    assert mfu.passes_per_step({"forwards": 0, "train_forwards": 0}, 12) == 1
