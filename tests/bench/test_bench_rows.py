import pytest

from pitstop.bench.cli import parse_budget
from pitstop.bench.configs import CLAIMS, Claim, ablation, effective, why_not
from pitstop.bench.rows import FAILED, Row, derive, verdict


def _row(**kw):
    base = dict(name="x", title="x", knobs="", samples_per_step=8, block_step_s=[0.5, 0.5, 0.5])
    base.update(kw)
    return Row(**base)


def test_derive_computes_rates_and_ratios_from_block_times():
    r = derive(
        _row(
            ref="baseline",
            ref_samples_per_s=8.0,
            peak_mem_bytes=300,
            ref_peak_mem_bytes=600,
            block_step_s=[0.5, 0.25, 1.0],
        ),
        1e9,
        {"float32": 1e11},
    )
    # throughput: 3 blocks of 8 samples a step over 1.75 s of steps (the median block says 16)
    assert r.samples_per_s == pytest.approx(8 * 3 / 1.75)
    assert (r.samples_per_s_min, r.samples_per_s_max) == (pytest.approx(8.0), pytest.approx(32.0))
    assert r.speedup == pytest.approx(8 * 3 / 1.75 / 8.0)
    assert r.memory_ratio == pytest.approx(0.5)
    assert r.model_flops_per_s == pytest.approx(8 * 3 / 1.75 * 1e9)
    assert r.peak_fraction == pytest.approx(8 * 3 / 1.75 * 1e9 / 1e11)


def test_the_speedup_interval_pairs_blocks_of_the_same_repeat():
    # the reference's blocks drift with the row's (same repeats): the paired interval is tight around 2x
    ref = [1.0, 0.5, 2.0, 1.1]
    r = derive(
        _row(
            block_step_s=[t / 2 for t in ref],
            ref_block_step_s=ref,
            ref_samples_per_step=8,
            ref_samples_per_s=8.0,
        ),
        None,
        {},
    )
    iv = r.speedup_interval
    assert iv["rounds"] == 4 and iv["lo"] == pytest.approx(2.0) and iv["hi"] == pytest.approx(2.0)
    # twice the samples per step at the same step time: twice the samples/s
    r2 = derive(
        _row(block_step_s=ref, ref_block_step_s=ref, ref_samples_per_step=4, ref_samples_per_s=4.0),
        None,
        {},
    )
    assert r2.speedup_interval["estimate"] == pytest.approx(2.0)
    assert derive(_row(ref_samples_per_s=8.0), None, {}).speedup_interval is None  # no reference blocks


def test_peak_fraction_uses_the_rows_dtype():
    r = derive(_row(dtype="bfloat16"), 1e9, {"float32": 1e11, "bfloat16": 4e11})
    assert r.peak_fraction == pytest.approx(16e9 / 4e11)


def test_verdict_places_measurement_against_the_claim():
    speed = Claim("AMP 2-3x", "speedup", 2.0, 3.0)
    assert "short of the claim" in derive(_row(claim=speed, ref_samples_per_s=16.0), None, {}).verdict
    assert "within the claim" in derive(_row(claim=speed, ref_samples_per_s=6.0), None, {}).verdict
    assert "better than the claim" in derive(_row(claim=speed, ref_samples_per_s=2.0), None, {}).verdict
    v = derive(_row(claim=speed, ref_samples_per_s=16.0), None, {}).verdict
    assert v.startswith("claim 2-3x, measured 1.00x")


def test_lower_is_better_for_memory_claims():
    mem = Claim("halves activations", "activations", 0.4, 0.6)
    low = derive(_row(claim=mem, activation_bytes=10, ref_activation_bytes=100), None, {})
    assert low.activation_ratio == pytest.approx(0.1)
    assert "better than the claim" in low.verdict
    high = derive(_row(claim=mem, activation_bytes=90, ref_activation_bytes=100), None, {})
    assert "short of the claim" in high.verdict


def test_unmeasured_row_says_why_and_has_no_numbers():
    r = derive(_row(status=FAILED, reason="boom", block_step_s=[]), 1e9, {"float32": 1.0})
    assert r.samples_per_s is None and r.speedup is None
    assert verdict(r) == "not measured: boom"


def test_ablation_has_baseline_each_optimization_and_all():
    names = [c.name for c in ablation("cpu", image_input=True, amp_dtype="bfloat16")]
    assert names[0] == "baseline"
    for n in ("workers", "pin_memory", "channels_last", "amp_bf16", "amp_fp16", "fused", "checkpoint",
              "accumulation", "all", "lightning", "accelerate", "compile", "all_compiled"):  # fmt: skip
        assert n in names
    assert "channels_last" not in [c.name for c in ablation("cpu", image_input=False, amp_dtype=None)]


def test_cpu_only_rows_say_why():
    cfgs = {c.name: c for c in ablation("cpu", True, "bfloat16")}
    assert "CUDA" in why_not(cfgs["amp_fp16"], "cpu", cuda_available=False)
    assert "CUDA" in why_not(cfgs["pin_memory"], "cpu", cuda_available=False)
    assert why_not(cfgs["amp_bf16"], "cpu", cuda_available=False) is None
    # The workers row keeps running on CPU, without pinning.
    assert effective(cfgs["workers"], "cpu", False).pin_memory is False
    assert why_not(cfgs["amp_fp16"], "cuda", cuda_available=True) is None


def test_claims_have_ranges_in_order():
    for c in CLAIMS.values():
        if c.low is not None:
            assert c.high is not None and c.low <= c.high


@pytest.mark.parametrize(("text", "seconds"), [("5m", 300), ("90s", 90), ("300", 300), ("1.5h", 5400)])
def test_parse_budget(text, seconds):
    assert parse_budget(text) == seconds


@pytest.mark.parametrize("text", ["", "5x", "-3m", "0", "m"])
def test_parse_budget_rejects_bad_input(text):
    with pytest.raises(ValueError):
        parse_budget(text)


def test_cuda_choices_with_a_faked_gpu(monkeypatch):
    import torch

    from pitstop.bench.runner import BenchOptions, _ddp_procs
    from pitstop.bench.subproc_rows import ddp_unavailable

    cfgs = {c.name: c for c in ablation("cuda", True, "float16")}
    assert cfgs["workers"].pin_memory is True  # the guides' claim is workers + pinned memory
    assert effective(cfgs["workers"], "cuda", True).pin_memory is True
    assert cfgs["all"].amp == "float16"  # pre-Ampere GPU: the fast AMP dtype is fp16
    assert "bf16" in why_not(cfgs["amp_bf16"], "cuda", cuda_available=True, bf16_ok=False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    assert _ddp_procs(BenchOptions(), "cuda") == 4
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert _ddp_procs(BenchOptions(), "cuda") == 0
    assert "CUDA device" in ddp_unavailable("cuda").reason
    assert _ddp_procs(BenchOptions(ddp_procs=3), "cpu") == 3
    assert _ddp_procs(BenchOptions(ddp_procs=1), "cpu") == 0


def test_a_speedup_claim_passes_only_on_an_interval_that_decides_it():
    from pitstop.bench.results import findings
    from pitstop.bench.runner import BenchOptions, BenchResult
    from pitstop.findings import Severity

    speed = Claim("AMP 2-3x", "speedup", 2.0, 3.0)
    ref = [1.0, 1.1, 0.9]

    def row(blocks, ref_blocks):
        return derive(
            _row(
                name="amp_bf16",
                claim=speed,
                block_step_s=blocks,
                ref_block_step_s=ref_blocks,
                ref_samples_per_step=8,
                ref_samples_per_s=8 / ref_blocks[0],
            ),
            None,
            {},
        )

    one = row([0.2], [1.1])  # one block a side: 5.5x, but no verdict
    steady = row([t / 3 for t in ref], ref)  # 3x in every block
    spread = row([0.2, 0.8, 0.3], ref)  # 5x, 1.4x, 3x: spans the claim's 2x
    result = BenchResult(BenchOptions(), "tiny", "cpu", 2, rows=[one, steady, spread])
    f_one = next(
        f
        for f in findings(BenchResult(BenchOptions(), "tiny", "cpu", 2, rows=[one]))
        if f.id == "bench.amp_bf16"
    )
    assert f_one.severity is Severity.INFO and "undecided: 1 block(s) a side" in f_one.evidence
    assert "--repeats" in f_one.fix
    sev = [f.severity for f in findings(result) if f.id == "bench.amp_bf16"]
    assert sev == [Severity.INFO, Severity.PASS, Severity.INFO]
    assert "95% CI 3.00" in steady.verdict and "undecided: it spans" in spread.verdict
