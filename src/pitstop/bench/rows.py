"""A benchmark row: what was measured for one config, and the ratios derived from those measurements.

Ratios are never stored alone: each row keeps its raw block times and the reference numbers the ratio
was taken against, so anyone can recompute it (the tests do).
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from pitstop.bench.configs import Claim
from pitstop.measure import UNDECIDED, against_bar
from pitstop.measure.throughput import Window, throughput_interval

MEASURED, SKIPPED, FAILED, TIMEOUT = "measured", "skipped", "failed", "timeout"


@dataclass
class Row:
    name: str
    title: str
    knobs: str
    status: str = MEASURED
    reason: str = ""  # why not measured (skipped/failed/timeout), or a note on how it was measured
    block_step_s: list[float] = field(default_factory=list)  # mean seconds/step of each timed block
    steps_per_block: int = 0
    samples_per_step: int = 0
    warmup_s: list[float] = field(default_factory=list)  # each warm-up step (compile shows here)
    peak_mem_bytes: int | None = None  # peak of one step above the memory live before it
    activation_bytes: int | None = None  # held for backward when the forward pass ends
    dtype: str = "float32"  # compute dtype: which matmul peak the row is compared with
    ref: str | None = None  # the row the ratios are taken against (same run, interleaved)
    ref_samples_per_s: float | None = None
    ref_block_step_s: list[float] = field(default_factory=list)  # the reference's blocks, same repeats
    ref_samples_per_step: int = 0
    ref_peak_mem_bytes: int | None = None
    ref_activation_bytes: int | None = None
    claim: Claim | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    # derived (fill with ``derive``)
    samples_per_s: float | None = None
    samples_per_s_min: float | None = None
    samples_per_s_max: float | None = None
    speedup: float | None = None
    # the timing engine's interval of the speed-up (``Interval.to_dict``), blocks paired by repeat
    speedup_interval: dict[str, Any] | None = None
    memory_ratio: float | None = None  # peak step memory / the reference's
    activation_ratio: float | None = None  # activation memory / the reference's
    model_flops_per_s: float | None = None
    peak_fraction: float | None = None
    verdict: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def derive(row: Row, flops_per_sample: float | None, peaks: dict[str, float]) -> Row:
    """Fill the derived fields from the row's own measurements and its reference."""
    if row.status == MEASURED and row.block_step_s and row.samples_per_step:
        times = [t for t in row.block_step_s if t > 0]
        if times:
            # throughput: every block's samples over every block's seconds (a slow block counts in full)
            row.samples_per_s = row.samples_per_step / statistics.fmean(times)
            rates = [row.samples_per_step / t for t in times]
            row.samples_per_s_min, row.samples_per_s_max = min(rates), max(rates)
    if row.samples_per_s and row.ref_samples_per_s:
        row.speedup = row.samples_per_s / row.ref_samples_per_s
        row.speedup_interval = _interval(row)
    if row.peak_mem_bytes is not None and row.ref_peak_mem_bytes:
        row.memory_ratio = row.peak_mem_bytes / row.ref_peak_mem_bytes
    if row.activation_bytes is not None and row.ref_activation_bytes:
        row.activation_ratio = row.activation_bytes / row.ref_activation_bytes
    if row.samples_per_s and flops_per_sample:
        row.model_flops_per_s = row.samples_per_s * flops_per_sample
        peak = peaks.get(row.dtype) or peaks.get("float32")
        if peak:
            row.peak_fraction = row.model_flops_per_s / peak
    row.verdict = verdict(row)
    return row


def _interval(row: Row) -> dict[str, Any] | None:
    """``measure.throughput.throughput_interval`` of the row's blocks against its reference's, block i
    with block i (the same repeat of the rotating rounds), scaled to samples/s where the step sizes
    differ."""
    n = max(1, row.steps_per_block)
    pairs = [
        (Window(n, n * b), Window(n, n * c))
        for b, c in zip(row.ref_block_step_s, row.block_step_s, strict=False)
        if b > 0 and c > 0
    ]
    iv = throughput_interval([p[0] for p in pairs], [p[1] for p in pairs])
    if iv is None:
        return None
    k = row.samples_per_step / row.ref_samples_per_step if row.ref_samples_per_step else 1.0
    return replace(iv, estimate=iv.estimate * k, lo=iv.lo * k, hi=iv.hi * k, unit="blocks").to_dict()


def claim_value(row: Row) -> float | None:
    """The measured number the row's claim is about."""
    if row.claim is None:
        return None
    if row.claim.metric == "memory":
        return row.memory_ratio
    if row.claim.metric == "activations":
        return row.activation_ratio
    if row.claim.metric in ("steps", "efficiency"):
        v = row.extra.get(row.claim.metric)
        return float(v) if isinstance(v, int | float) else None
    return row.speedup


def claim_decision(row: Row) -> str | None:
    """A speed-up claim's verdict from the row's interval (``measure.against_bar`` against the claim's
    low end): HELPED when the lower bound reaches it, NO_GAIN when the upper bound is under it, UNDECIDED
    without an interval that decides (one block a side gives none). None for claims on counted
    quantities (memory, steps), which are not timing noise, and for rows without a numeric claim."""
    c = row.claim
    if row.status != MEASURED or c is None or c.metric != "speedup" or c.low is None:
        return None
    iv = row.speedup_interval or {}
    lo = iv.get("lo") if iv.get("rounds", 0) >= 2 else None
    return against_bar(lo, iv.get("hi"), c.low)


def _decision_text(row: Row) -> str:
    """'' for claims without a timed verdict; else the interval the verdict rests on, or why undecided."""
    decision = claim_decision(row)
    iv = row.speedup_interval or {}
    if decision is None:
        return ""
    n = iv.get("rounds", 0)
    if n < 2:
        return f"; undecided: {n} block(s) a side, no interval"
    ci = f"95% CI {iv['lo']:.2f}\u2013{iv['hi']:.2f}x over {n} blocks"
    return f"; {ci}" + ("; undecided: it spans the claim's low end" if decision == UNDECIDED else "")


def verdict(row: Row) -> str:
    """'claim 2-3x, measured 1.4x' style sentence; says why when there is no number."""
    if row.status != MEASURED:
        return f"not measured: {row.reason}"
    c = row.claim
    v = claim_value(row)
    if c is None or v is None:
        return ""
    unit = {
        "speedup": "x",
        "memory": "x peak memory",
        "activations": "x activation memory",
        "steps": "x steps",
        "efficiency": " efficiency",
    }[c.metric]
    measured = f"{100 * v:.0f}%{unit}" if c.metric == "efficiency" else f"{v:.2f}{unit}"
    if c.low is None or c.high is None:
        return f"measured {measured}"
    claimed = (
        f"{100 * c.low:.0f}-{100 * c.high:.0f}%{unit}"
        if c.metric == "efficiency"
        else f"{c.low:g}-{c.high:g}{unit}"
    )
    lower_is_better = c.metric in ("memory", "activations", "steps")
    if c.low <= v <= c.high:
        where = "within the claim"
    elif (v < c.low) != lower_is_better:
        where = "short of the claim"
    else:
        where = "better than the claim"
    return f"claim {claimed}, measured {measured} ({where}){_decision_text(row)}"
