"""The rows measured in subprocesses: DDP under torch.distributed.run (gloo) and the compile worker."""

import time

import pytest

from pitstop.bench.configs import BASELINE, CLAIMS, BenchConfig
from pitstop.bench.rows import MEASURED, TIMEOUT, derive
from pitstop.bench.schedules import ScheduleResult, compare_schedules
from pitstop.bench.subproc import WorkerHandle, WorkerResult, run_worker
from pitstop.bench.subproc_rows import NoProgress, _finish_worker_row, ddp_rows, error_line, isolated_rows
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
    one, two = ddp_rows(
        SPEC, 2, threads=2, device="cpu", budget_s=300, baseline_step=None, progress=NoProgress()
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
    cfg = BenchConfig("compile", "torch.compile", compile=True, claim=CLAIMS["compile"])
    r = run_worker(dict(SPEC, threads=1, configs=[cfg.to_dict()]), timeout_s=1.0)
    assert r.timed_out
    from pitstop.bench.rows import Row

    row = Row(cfg.name, cfg.title, cfg.knobs(), claim=cfg.claim)
    _finish_worker_row(row, r, "torch.compile")
    assert row.status == TIMEOUT
    assert "budget" in row.reason and "--budget" in row.reason
    assert derive(row, None, {}).verdict.startswith("not measured:")


def test_compile_rows_from_a_timed_out_worker_say_why():
    cfg = BenchConfig("compile", "torch.compile", compile=True, claim=CLAIMS["compile"])
    r = WorkerResult({"rows": {}, "phase": "warm-up"}, None, 150.0, "")
    rows = isolated_rows(r, [cfg], 150.0)
    assert [row.status for row in rows] == [TIMEOUT]
    assert "150 s" in rows[0].reason and "--budget" in rows[0].reason


@pytest.mark.slow
def test_held_worker_times_only_after_go():
    cfgs = [BASELINE.to_dict(), BenchConfig("fused", "fused", optimizer_impl="fused").to_dict()]
    h = WorkerHandle(dict(SPEC, threads=1, configs=cfgs, hold=True))
    try:
        assert h.wait_until(lambda w: w.phase() == "ready", time.monotonic() + 240), h.err_path.read_text()[
            -2000:
        ]
        held = h.payload()["rows"]
        assert all(row["block_step_s"] == [] and len(row["warmup_s"]) == 1 for row in held.values())
        h.go(3)
    finally:
        r = h.finish(240)
    assert r.returncode == 0, r.stderr_tail
    assert r.payload["done"] is True
    for name in ("baseline", "fused"):
        row = r.payload["rows"][name]
        assert row["status"] == MEASURED and len(row["block_step_s"]) == 2
        assert row["steps_per_block"] == 3  # the steps the parent sent with go


def test_error_line_finds_the_exception():
    err = "W123 warning\nTraceback (most recent call last):\n  File x\nImportError: cannot import name 'x'\n===\n"
    assert error_line(err) == "ImportError: cannot import name 'x'"
    assert error_line("") == "no output"


def test_schedules_count_steps_to_target():
    res = compare_schedules(seeds=1, target=0.5, ladder=(20, 40))
    for name in ("onecycle", "steplr"):
        steps = res.steps_to_target[name]
        assert len(steps) == 1
        accs = res.accuracy[name][0]
        assert steps[0] in (None, 20, 40) and set(accs) <= {20, 40}
        reached = [h for h, a in sorted(accs.items()) if a >= 0.5]
        assert steps[0] == (reached[0] if reached else None)  # the first run length that got there


def test_unreached_target_counts_as_the_horizon():
    res = ScheduleResult("t", 0.9, horizon=100, steps_to_target={"a": [None, 40, None], "b": [10, 20, 30]})
    assert res.median_steps("a") == 100
    assert res.median_steps("b") == 20
    assert res.median_steps("c") is None


def test_compile_rows_ratio_is_against_the_workers_own_baseline():
    from pitstop.bench.rows import Row

    cfg = BenchConfig("compile", "torch.compile", compile=True, claim=CLAIMS["compile"])
    ref = Row(
        "baseline_compile_ref",
        "baseline (compile worker)",
        "",
        block_step_s=[0.2, 0.4, 0.3],
        samples_per_step=8,
    )
    comp = Row(
        "compile",
        "torch.compile",
        "",
        block_step_s=[0.1, 0.2, 0.15],
        samples_per_step=8,
        warmup_s=[30.0, 0.2],
    )
    comp.claim = cfg.claim
    payload = {"done": True, "rows": {"baseline_compile_ref": ref.to_dict(), "compile": comp.to_dict()}}
    rows = {r.name: r for r in isolated_rows(WorkerResult(payload, 0, 60.0, ""), [cfg], 60.0)}
    got = derive(rows["compile"], None, {})
    assert got.status == MEASURED and got.ref == "baseline_compile_ref"
    assert got.ref_samples_per_s == pytest.approx(8 / 0.3)
    assert got.speedup == pytest.approx((8 / 0.15) / (8 / 0.3))
    assert got.extra["compile_warmup_s"] == 30.0
    assert "within the claim" in got.verdict  # 2.0x against a 1.3-2x claim
