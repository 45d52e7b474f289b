"""Model FLOPs utilisation: the script's model FLOPs per step over step time, against the measured
matmul peak of this device in the dtype the model computes in.

``measure`` runs in the script's process after the measured steps (next to the probes): one
forward+backward of the top-level model on its last batch under ``FlopCounterMode`` (under the script's
autocast, if any), then ``pitstop.matmul.matmul_peak`` with small sizes and a short run time. Both
are bounded: a pass slower than ``MAX_PASS_S`` is not counted. ``section`` is pure: it takes those
numbers and the run's median step time and gives the report's ``mfu`` section. Optimizer FLOPs are left
out, as nanoGPT and torchtitan do.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pitstop.measure.clock import Stopwatch
from pitstop.profile.record.parts import Totals
from pitstop.units import duration

MAX_PASS_S = 5.0
PEAK_SIZES = {"cpu": (256, 512), "cuda": (2048, 4096)}
PEAK_MIN_RUN_S = 0.05


def compute_dtype(facts: dict[str, Any]) -> str:
    """The dtype matmuls run in: autocast's when on, else the parameters' (float32 when mixed)."""
    if facts.get("autocast") and facts.get("autocast_dtype"):
        return str(facts["autocast_dtype"])
    dtypes = facts.get("param_dtypes") or ["float32"]
    return str(dtypes[0]) if len(dtypes) == 1 else "float32"


def count_flops(model: Any, inputs: tuple[tuple[Any, ...], dict[str, Any]], facts: dict[str, Any]) -> float:
    """FLOPs of one forward+backward of ``model`` on ``inputs``, as FlopCounterMode counts them."""
    from torch.utils.flop_counter import FlopCounterMode

    from pitstop.profile.probe.probe_kit import as_script, fwd_bwd

    p = next(model.parameters(), None)
    dev = p.device.type if p is not None else "cpu"
    args, kwargs = inputs
    counter = FlopCounterMode(display=False)
    with counter, as_script(dev, facts):
        fwd_bwd(model, args, kwargs)
    return float(counter.get_total_flops())


def measure(
    model: Any,
    inputs: tuple[tuple[Any, ...], dict[str, Any]] | None,
    facts: dict[str, Any],
    probes: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """FLOPs of one training pass and the matmul peak for this device and dtype (or why not). ``probes``
    (when they ran) gives the time of one plain pass: a slower one than ``MAX_PASS_S`` is not counted,
    as counting runs every op through Python and is slower still."""
    if model is None or inputs is None:
        return {"skipped": "no model forward with a batch was captured"}
    if (pass_s := (probes or {}).get("pass_s", 0.0)) > MAX_PASS_S:
        return {"skipped": f"one forward+backward took {pass_s:.1f} s (> {MAX_PASS_S} s)"}
    p = next(model.parameters(), None)
    if p is None:
        return {"skipped": "the model has no parameters"}
    device = p.device.type
    if device not in PEAK_SIZES:
        return {"skipped": f"no matmul peak for device type {device}"}
    dtype = compute_dtype(facts)
    watch = Stopwatch()
    try:
        flops = count_flops(model, inputs, facts)
    except Exception as e:
        return {"error": f"FlopCounterMode failed: {type(e).__name__}: {e}"}
    count_s = watch.elapsed()
    if count_s > MAX_PASS_S:
        return {
            "skipped": f"one counted pass took {count_s:.1f} s (> {MAX_PASS_S} s)",
            "flops_per_pass": flops,
        }
    from pitstop.matmul import matmul_peak

    try:
        peak = matmul_peak(dtype, device, sizes=PEAK_SIZES[device], min_run_time=PEAK_MIN_RUN_S)
    except Exception as e:
        return {
            "flops_per_pass": flops,
            "dtype": dtype,
            "error": f"matmul peak failed: {type(e).__name__}: {e}",
        }
    return {
        "flops_per_pass": flops,
        "dtype": dtype,
        "device": device,
        "peak_flops_per_s": peak.flops_per_s,
        "peak_size": peak.n,
        "measure_s": watch.elapsed(),
    }


def passes_per_step(totals: Totals | Mapping[str, Any], steps: int) -> float:
    """Training forward+backward passes per step: top-level forwards with grad on and the module in
    training mode (``train_forwards``), so a no-grad sampling callback, an inference-mode or an eval pass
    is not counted as training; at least one. Records from before that count use all forwards."""
    t = Totals.of(totals)
    forwards = t.train_forwards if t.train_forwards is not None else t.forwards or 0
    return max(1.0, round(forwards / steps)) if steps else 1.0


def section(
    m: dict[str, Any] | None, median_step_s: float | None, passes_per_step: float
) -> dict[str, Any] | None:
    """The report's ``mfu`` section: FLOPs per step (training passes x FLOPs of one), achieved FLOP/s at
    the median step time, the peak, and their ratio. A ratio over 1 is a measurement that does not add
    up (passes counted that did not train, a peak measured under load): ``mfu`` is None and
    ``inconsistent`` says why, so it is never reported as utilisation."""
    if not m:
        return None
    if "flops_per_pass" not in m or "peak_flops_per_s" not in m or not median_step_s:
        return {k: m[k] for k in ("skipped", "error", "flops_per_pass", "dtype") if k in m} or None
    per_step = m["flops_per_pass"] * max(1.0, passes_per_step)
    achieved = per_step / median_step_s
    ratio = achieved / m["peak_flops_per_s"] if m["peak_flops_per_s"] > 0 else None
    out = {
        "flops_per_step": per_step,
        "passes_per_step": max(1.0, passes_per_step),
        "achieved_flops_per_s": achieved,
        "peak_flops_per_s": m["peak_flops_per_s"],
        "peak": m["peak_flops_per_s"],
        "peak_size": m.get("peak_size"),
        "dtype": m["dtype"],
        "device": m.get("device"),
        "median_step_s": median_step_s,
        "mfu": ratio,
    }
    if ratio is not None and ratio > 1.0:
        out["mfu"] = None
        out["inconsistent"] = (
            f"{per_step / 1e9:.2f} GFLOP per step (FlopCounterMode, forward+backward x {out['passes_per_step']:.0f} "
            f"training passes) in the {duration(median_step_s)} median step is {achieved / 1e12:.3f} TFLOP/s, "
            f"{100 * ratio:.0f}% of the {m['peak_flops_per_s'] / 1e12:.3f} TFLOP/s {m['dtype']} matmul peak "
            "measured here: more than the device can do, so the FLOPs counted per step or the peak are wrong "
            "for this run (a pass counted that does not run every step, a peak measured under load)"
        )
    return out
