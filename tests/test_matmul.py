"""pitstop.matmul: torch.mm speed measured within a time bound. The slow path (bf16 on a CPU without
bf16 instructions) is faked by the ``bf16less_cpu`` fixture, so nothing here depends on this CPU."""

from __future__ import annotations

import pytest

from pitstop import matmul
from pitstop.doctor.cpu import check_bf16


def test_a_slow_dtype_is_found_on_a_small_call_and_the_large_sizes_are_skipped(bf16less_cpu):
    p = matmul.matmul_peak("bfloat16", budget_s=5.0)
    sizes = {n for dt, n, _ in bf16less_cpu if dt == "bfloat16"}
    assert 2048 not in sizes and 1024 not in sizes  # 57 s and ~7 s a call: never started
    assert min(sizes) == matmul.PROBE_N
    assert p.skipped == (1024, 2048) and p.n in p.timed
    assert p.spent_s <= 5.0
    assert p.flops_per_s == pytest.approx(2 * 2048**3 / 57.0)
    assert "bf16 torch.mm: 0.301 GFLOP/s, emulated on this CPU" in p.note and "skipped n=1024, 2048" in p.note


def test_a_fast_dtype_times_every_size_asked_for(bf16less_cpu):
    p = matmul.matmul_peak("float32", budget_s=10.0)
    assert p.timed == (256, 512, 1024, 2048) and p.skipped == () and p.note == ""
    assert p.flops_per_s == pytest.approx(89e9)
    assert p.seconds == pytest.approx(2 * p.n**3 / 89e9)


def test_the_first_call_always_runs_and_nothing_after_it_when_the_budget_is_spent(bf16less_cpu):
    p = matmul.matmul_peak("bfloat16", sizes=(512, 1024), budget_s=0.01)
    assert [(n, k) for _, n, k in bf16less_cpu] == [(256, 1)]  # one warm-up call of the probe size
    assert p.skipped == (512, 1024) and p.n == 256


def test_low_precision_check_and_the_sentence_doctor_and_bench_share(bf16less_cpu):
    lp = matmul.low_precision("bfloat16", "cpu")
    assert lp.slower and lp.slowdown == pytest.approx(89e9 / (2 * 2048**3 / 57.0))
    assert lp.peak.spent_s + lp.fp32.spent_s <= matmul.CHECK_BUDGET_S
    line = matmul.cpu_bf16_line(check=lp)
    assert (
        line.startswith("no bf16 hardware on this CPU") and "bf16 torch.mm 0.301 GFLOP/s vs fp32 89" in line
    )
    (f,) = check_bf16(frozenset({"avx2", "fma"}), lp)
    assert f.id == "cpu.bf16" and f.evidence == line and f.fix_code is None
    assert f.data["bf16_flops_per_s"] == pytest.approx(lp.peak.flops_per_s)
    assert "slower" in matmul.slower_reason("bfloat16", "cpu")


def test_fast_bf16_flags_that_measure_slow_are_not_trusted(bf16less_cpu):
    lp = matmul.low_precision("bfloat16", "cpu")
    (f,) = check_bf16(frozenset({"avx512_bf16"}), lp)
    assert "measured slower" in f.title and f.fix_code is None
    (f,) = check_bf16(frozenset({"avx512_bf16"}))
    assert "autocast" in f.fix_code


def test_predicted_time_is_never_below_the_fp32_time():
    assert matmul.predicted_s(0.01, 89e9, 0.3e9) == pytest.approx(0.01 * 89 / 0.3)
    assert matmul.predicted_s(0.01, 1e9, 4e9) == 0.01


def test_real_matmul_peak_on_this_machine_is_bounded():
    p = matmul.matmul_peak("float32", sizes=(32, 64), min_run_time=0.02, budget_s=2.0)
    assert p.flops_per_s > 0 and p.n in (32, 64) and p.flops_per_s == 2 * p.n**3 / p.seconds
