"""Time bounds of the bench measurements that can be slow on some hardware: the matmul peaks, and the
rows that compute in a dtype this machine runs slowly (bf16 on a CPU without bf16 instructions).

A slow dtype's row is predicted before it is built: its step takes at most the fp32 baseline's step
times the fp32/dtype matmul ratio. The row runs when that fits its share of what is left of the
budget; otherwise it is skipped with the measured rates as the reason.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from pitstop.bench.configs import BenchConfig
from pitstop.bench.rows import SKIPPED
from pitstop.matmul import SHORT, LowPrecision, Peak, cpu_bf16_line, emulated_note, matmul_peak, predicted_s

PEAKS_SHARE, PEAKS_MAX_S = 0.1, 20.0  # the matmul peaks get this share of the --budget, at most this
ABLATION_SHARE = 0.85  # of what is left, as in the runner's block sizing


def peaks_budget(budget_s: float) -> float:
    return min(PEAKS_MAX_S, PEAKS_SHARE * budget_s)


def measure_peaks(device: str, budget_s: float) -> dict[str, Peak]:
    """torch.mm peaks of fp32, bf16 (and fp16 on CUDA) within ``budget_s`` together, fp32 first; a
    dtype's unspent share passes to the next. A dtype the build/device cannot run is left out."""
    dtypes = ["float32", "bfloat16"] + (["float16"] if device == "cuda" else [])
    out: dict[str, Peak] = {}
    t0 = time.monotonic()
    spent = 0.0
    for i, dt in enumerate(dtypes):
        left = budget_s - max(spent, time.monotonic() - t0)
        try:
            out[dt] = p = matmul_peak(dt, device, budget_s=max(0.0, left) / (len(dtypes) - i))
        except RuntimeError:  # dtype unsupported by this build/device
            continue
        spent += p.spent_s
    return out


def peak_notes(peaks: dict[str, Peak], device: str) -> list[str]:
    """What the bounds did to the peaks, and (CPU) the bf16 sentence doctor's cpu.bf16 also says."""
    notes = [p.note for p in peaks.values() if p.note]
    if device == "cpu" and "bfloat16" in peaks and "float32" in peaks:
        notes.append(
            cpu_bf16_line(check=LowPrecision("bfloat16", "cpu", peaks["bfloat16"], peaks["float32"]))
        )
    return notes


SkipCheck = Callable[[BenchConfig, list[Any]], str | None]


def slow_dtype_check(
    peaks: dict[str, float], device: str, warmup: int, repeats: int, deadline: float, n_configs: int
) -> SkipCheck:
    """``check(config, lives_so_far)``: why a config that computes in a slower dtype than fp32 cannot fit
    its share of the budget, or None (fp32 configs, fast dtypes, or a prediction that fits)."""

    def check(config: BenchConfig, lives: list[Any]) -> str | None:
        rate, fp32 = peaks.get(config.amp or ""), peaks.get("float32")
        if not rate or not fp32 or rate >= fp32:
            return None
        base = next((lv for lv in lives if lv.config.name == "baseline" and lv.session is not None), None)
        if base is None or not base.estimate_s:
            return None  # nothing to predict from: the warm-up's own deadline bounds it
        step = predicted_s(base.estimate_s, fp32, rate)
        # its warm-up steps and the memory step; the timed blocks are checked on the measured step time
        need = step * (max(1, warmup) + 1)
        n_left = max(1, n_configs - len(lives) + 1)
        share = ABLATION_SHARE * max(0.0, deadline - time.monotonic()) / n_left
        if need <= share:
            return None
        name = SHORT.get(config.amp or "", config.amp)
        return (
            f"{name} torch.mm {rate / 1e9:.3g} GFLOP/s vs fp32 {fp32 / 1e9:.3g} GFLOP/s here "
            f"({fp32 / rate:.0f}x slower{emulated_note(config.amp or '', device)}): "
            f"a {name} step could take {step:.2g} s, {need:.0f} s to warm up, over its {share:.0f} s share "
            "of the --budget"
        )

    return check


def drop_slow_rows(lives: list[Any], peaks: dict[str, float], repeats: int, deadline: float) -> None:
    """After warm-up: a slow-dtype row whose measured step makes its blocks (a re-warm and at least one
    timed step per repeat) overrun its share of what is left is closed and skipped, with the step time."""
    active = [lv for lv in lives if lv.session is not None]
    share = ABLATION_SHARE * max(0.0, deadline - time.monotonic()) / max(1, len(active))
    for lv in active:
        rate, fp32 = peaks.get(lv.config.amp or ""), peaks.get("float32")
        need = lv.estimate_s * 2 * repeats
        if rate and fp32 and rate < fp32 and need > share:
            name = SHORT.get(lv.config.amp or "", lv.config.amp)
            lv.row.status = SKIPPED
            lv.row.reason = (
                f"a {name} step took {lv.estimate_s:.2g} s in warm-up ({name} torch.mm {rate / 1e9:.3g} GFLOP/s "
                f"vs fp32 {fp32 / 1e9:.3g} GFLOP/s here): its blocks need {need:.0f} s, over its {share:.0f} s "
                "share of the --budget"
            )
            lv.session.close()
            lv.session = None
