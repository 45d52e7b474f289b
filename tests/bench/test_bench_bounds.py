"""bench on a CPU without bf16 hardware (faked: flags and torch.mm speed, see tests/conftest.py): the
peaks stay inside their share, a bf16 row runs or is skipped with the measured reason, fp32 rows run."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from pitstop.bench.bounds import drop_slow_rows, measure_peaks, peak_notes, slow_dtype_check
from pitstop.bench.configs import BASELINE, BenchConfig
from pitstop.bench.rows import MEASURED, SKIPPED
from pitstop.bench.runner import BenchOptions, run_bench
from pitstop.doctor.cpu import check_bf16
from pitstop.matmul import LowPrecision, cpu_bf16_line

SLOW = 89e9 / (2 * 2048**3 / 57.0)  # fp32 / bf16 torch.mm rate of the faked CPU


def test_peaks_fit_their_budget_and_say_what_they_skipped(bf16less_cpu):
    peaks = measure_peaks("cpu", 4.0)
    assert sum(p.spent_s for p in peaks.values()) <= 4.0
    assert peaks["float32"].skipped == () and peaks["bfloat16"].skipped == (1024, 2048)
    assert not [c for c in bf16less_cpu if c[0] == "bfloat16" and c[1] >= 1024]
    notes = peak_notes(peaks, "cpu")
    assert any("bf16 torch.mm: 0.301 GFLOP/s, emulated on this CPU; skipped n=1024, 2048" in n for n in notes)
    lp = LowPrecision("bfloat16", "cpu", peaks["bfloat16"], peaks["float32"])
    # bench's result and doctor's cpu.bf16 finding say the same sentence
    assert cpu_bf16_line(check=lp) in notes
    assert check_bf16(frozenset({"avx2"}), lp)[0].evidence == cpu_bf16_line(check=lp)


def _lives(estimate_s: float) -> list[SimpleNamespace]:
    return [SimpleNamespace(config=BASELINE, session=object(), estimate_s=estimate_s)]


def test_a_slow_dtype_row_is_skipped_when_its_predicted_time_exceeds_its_share(bf16less_cpu):
    amp = BenchConfig("amp_bf16", "AMP bf16", autocast="bfloat16")
    peaks = {"float32": 89e9, "bfloat16": 89e9 / SLOW}
    check = slow_dtype_check(peaks, "cpu", warmup=2, repeats=3, deadline=time.monotonic() + 60, n_configs=3)
    reason = check(amp, _lives(0.03))  # 0.03 s x 295 = 9 s a step, 27 s to warm up; share ~17 s
    assert reason and "295x slower, emulated on this CPU" in reason and "share of the --budget" in reason
    assert check(amp, _lives(0.01)) is None  # 9 s to warm up: it is built, and judged on its real step
    assert check(BASELINE, _lives(0.01)) is None  # fp32 rows are never predicted away
    fast = slow_dtype_check({"float32": 1e9, "bfloat16": 2e9}, "cpu", 2, 3, time.monotonic(), 3)
    assert fast(amp, _lives(10.0)) is None  # a faster dtype is bounded by the deadline alone


@pytest.mark.slow
def test_tiny_bench_holds_its_budget_on_a_bf16less_cpu(bf16less_cpu):
    budget = 60.0
    opts = BenchOptions(workload="tabular", size="tiny", budget_s=budget, repeats=2, warmup=1, threads=1,
                        peers=False, compile=False, ddp_procs=0, schedules=False, workers=1)  # fmt: skip
    t = time.monotonic()
    res = run_bench(opts)
    wall = time.monotonic() - t
    assert wall <= 1.1 * budget, (wall, res.phases_s)  # the contract; the slow mm is faked, not run
    rows = {r.name: r for r in res.rows}
    for name in ("baseline", "workers", "fused", "checkpoint", "accumulation", "all"):
        assert rows[name].status == MEASURED, (name, rows[name].reason)
        assert rows[name].dtype == "float32" and rows[name].block_step_s
    amp = rows["amp_bf16"]
    assert amp.status == MEASURED or (amp.status == SKIPPED and "emulated on this CPU" in amp.reason)
    assert not [c for c in bf16less_cpu if c[0] == "bfloat16" and c[1] >= 1024]
    assert any(n.startswith("no bf16 hardware on this CPU") for n in res.notes)
    assert res.peaks["bfloat16"] == pytest.approx(2 * 2048**3 / 57.0)


class _FakeSession:
    """A session whose steps 'take' ``step_s`` without running: ``block`` returns that time."""

    def __init__(self, step_s: float) -> None:
        self.step_s, self.blocks, self.closed = step_s, 0, False

    def block(self, steps: int, threads: int) -> float:
        self.blocks += 1
        return self.step_s

    def close(self) -> None:
        self.closed = True


def test_blocks_that_cannot_end_before_the_deadline_are_skipped_but_the_first_runs():
    from pitstop.bench.measure_configs import ConfigRun, calibrate, new_row, time_blocks

    lives = []
    for name, est in (("baseline", 100.0), ("fused", 0.001), ("checkpoint", 100.0)):
        cfg = BenchConfig(name, name)
        lives.append(ConfigRun(cfg, new_row(cfg), _FakeSession(est), estimate_s=est))
    calibrate(lives, 1, deadline=time.monotonic() + 1.0)  # 200 s blocks: warm-up estimates kept
    assert [lv.estimate_s for lv in lives] == [100.0, 0.001, 100.0]
    # The fake blocks take no real time: only the predicted ends stop the repeats.
    assert time_blocks(lives, 2, 3, 1, deadline=time.monotonic() + 1.0) == 1
    base, fused, ck = (lv.row for lv in lives)
    assert base.status == MEASURED and base.block_step_s == [100.0]  # the reference is always timed once
    assert fused.status == MEASURED and fused.block_step_s == [0.001] * 2  # repeat 2 began with it
    assert ck.status == SKIPPED and "ran out before its timed blocks" in ck.reason and not ck.block_step_s
    assert lives[2].session is None


def test_a_slow_dtype_row_whose_measured_step_cannot_fit_is_closed_after_warm_up():
    from pitstop.bench.measure_configs import ConfigRun, new_row

    peaks = {"float32": 89e9, "bfloat16": 89e9 / SLOW}
    cfgs = [BASELINE, BenchConfig("amp_bf16", "AMP bf16", autocast="bfloat16"), BenchConfig("fused", "fused")]
    lives = [
        ConfigRun(c, new_row(c), _FakeSession(est), estimate_s=est)
        for c, est in zip(cfgs, (0.01, 5.0, 5.0), strict=True)
    ]
    drop_slow_rows(lives, peaks, repeats=3, deadline=time.monotonic() + 60)  # share ~17 s; needs 30 s
    base, amp, fused = (lv.row for lv in lives)
    assert (
        amp.status == SKIPPED and "a bf16 step took 5 s in warm-up" in amp.reason and lives[1].session is None
    )
    assert fused.status == MEASURED and lives[2].session is not None  # fp32 rows are never dropped
    assert base.status == MEASURED


def test_schedule_seeds_after_the_first_stop_at_the_deadline():
    from pitstop.bench.schedules import compare_schedules

    res = compare_schedules(seeds=3, target=0.5, ladder=(20, 40), deadline=time.monotonic())
    assert len(res.steps_to_target["onecycle"]) == len(res.steps_to_target["steplr"]) == 1
