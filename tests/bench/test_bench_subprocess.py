"""The rows measured in subprocesses: DDP under torch.distributed.run (gloo) and the compile worker."""

import pytest

from pitstop.bench.configs import BASELINE, CLAIMS, Config
from pitstop.bench.rows import MEASURED, TIMEOUT, derive
from pitstop.bench.runner import _ddp_rows, _finish_worker_row, _isolated_rows, _NoProgress
from pitstop.bench.schedules import ScheduleResult, compare_schedules
from pitstop.bench.subproc import run_worker
from pitstop.bench.workloads import WorkloadSpec

SPEC = {
    "workload": WorkloadSpec("tabular", "tiny").to_dict(),
    "device": "cpu",
    "warmup": 1,
    "repeats": 2,
    "steps": 2,
    "seed": 0,
}


@pytest.mark.slow
def test_ddp_two_processes_gloo_scaling_efficiency():
    one, two = _ddp_rows(
        SPEC, 2, threads=2, device="cpu", budget_s=300, baseline_step=None, progress=_NoProgress()
    )
    assert one.status == MEASURED, one.reason
    assert two.status == MEASURED, two.reason
    assert one.extra["processes"] == 1 and two.extra["processes"] == 2
    assert two.extra["backend"] == "gloo" and two.extra["threads_per_process"] == 1
    assert two.samples_per_step == 2 * one.samples_per_step  # both ranks train a batch each step
    assert two.ref == "ddp_1"
    assert two.speedup == pytest.approx(two.samples_per_s / one.samples_per_s)
    assert two.extra["efficiency"] == pytest.approx(two.speedup / 2)
    assert "efficiency" in derive(two, None, {}).verdict


def test_worker_killed_by_timeout_reports_why():
    cfg = Config("compile", "torch.compile", compile=True, claim=CLAIMS["compile"])
    r = run_worker(dict(SPEC, threads=1, configs=[cfg.to_dict()]), timeout_s=1.0)
    assert r.timed_out
    from pitstop.bench.rows import Row

    row = Row(cfg.name, cfg.title, cfg.knobs(), claim=cfg.claim)
    _finish_worker_row(row, r, "torch.compile")
    assert row.status == TIMEOUT
    assert "budget" in row.reason and "--budget" in row.reason
    assert derive(row, None, {}).verdict.startswith("not measured:")


def test_compile_rows_skip_when_budget_is_spent():
    rows = _isolated_rows(SPEC, [Config("compile", "torch.compile", compile=True)], 1, 5.0, _NoProgress())
    assert [r.status for r in rows] == ["skipped"]
    assert "budget" in rows[0].reason


def test_worker_measures_configs_interleaved():
    cfgs = [BASELINE.to_dict(), Config("fused", "fused", fused=True).to_dict()]
    r = run_worker(dict(SPEC, threads=1, configs=cfgs, steps=1), timeout_s=300)
    assert r.returncode == 0, r.stderr_tail
    assert r.payload["done"] is True
    for name in ("baseline", "fused"):
        row = r.payload["rows"][name]
        assert row["status"] == MEASURED and len(row["block_step_s"]) == 2


def test_schedules_count_steps_to_target():
    res = compare_schedules(seeds=1, target=0.5, horizon=60)
    for name in ("onecycle", "steplr"):
        steps = res.steps_to_target[name]
        assert len(steps) == 1
        assert steps[0] is None or (0 < steps[0] <= 60 and steps[0] % 5 == 0)


def test_unreached_target_counts_as_the_horizon():
    res = ScheduleResult("t", 0.9, horizon=100, steps_to_target={"a": [None, 40, None], "b": [10, 20, 30]})
    assert res.median_steps("a") == 100
    assert res.median_steps("b") == 20
    assert res.median_steps("c") is None
