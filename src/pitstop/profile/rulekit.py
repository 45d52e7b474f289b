"""What every profile rule shares: the thresholds that make a cost a warning, and the few formatters
for the numbers findings quote."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pitstop.findings import Severity

if TYPE_CHECKING:
    from pitstop.profile.timeline import Breakdown

WARN_SHARE = 0.05  # a problem costing >= 5% of the step is worth fixing first
MIN_PROBE_GAIN = 0.05  # a probed change must save >= 5% of the probed pass to count (noise)
GPU_IDLE_PCT = 70.0
MIN_SHARE = 0.01  # a finding whose whole point is its cost is left out under 1% of the step
FAULTS_WORTH_A_RUN = 256  # untimed page faults per step (1 MiB of fresh pages) worth a `pitstop fix` run
MIN_FAULTS_TO_TIME = 200  # fewer faults saved in the probe: its time difference is mostly noise
MEASURES = ("compute.mfu",)  # info findings that report a measurement, not an unmeasured problem


def probe_helps(probe: dict[str, Any]) -> bool:
    """A probed change counts only when it saves more than MIN_PROBE_GAIN of the probed pass."""
    return probe["saving_s"] > MIN_PROBE_GAIN * probe["base_s"]


def sev(share: float | None) -> Severity:
    return Severity.WARN if share is not None and share >= WARN_SHARE else Severity.INFO


def ms(s: float) -> str:
    return f"{s * 1000:.1f} ms"


def pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def cost(bd: Breakdown, saving: float) -> tuple[float, float]:
    saving = max(0.0, saving)
    return saving, min(1.0, saving / bd.total_s) if bd.total_s > 0 else 0.0
