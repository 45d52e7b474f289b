"""Predictions read off the run's own steps, given an interval from their spread over the run.

``dataloader.workers`` predicts that loading in worker processes saves the data wait: the step would
take its time minus the wait. That is one number per step, so its interval comes from how the wait
varies over the run: the measured steps are cut into contiguous blocks (at least ``MIN_PER_BLOCK``
steps, at most ``MAX_BLOCKS`` blocks), each block is one round for ``pitstop.measure.speedup_interval``
(its step times against the same steps without their wait, ratio of medians), and the speed-up's
bounds become the saving's: median step x (1 - 1 / speed-up). Blocks rather than steps are the unit
because neighbouring steps are correlated (an epoch boundary, a slow stretch of the disk), as runs
are in ``pitstop.measure``. The finding is then judged as every prediction is
(``pitstop.profile.confirm.judged``): a warning only when the lower bound is at least ``WARN_SHARE`` of
the median step, else info, not confirmed, with ``saving_ci_s`` in its data either way.

On a CPU-only run the workers' loading competes with the compute for the same cores, so the lower
bound also allows for the worst case: the compute keeps all ``usable_cores`` busy, the loader's work
(the wait, done in the main process now) is spread over them, and ``1 / cores`` of it stays on the
step's critical path: the sure saving is the wait's lower bound x (1 - 1 / cores). The upper bound
(every second of the wait gone) is the best case, where the compute leaves cores idle.
"""

from __future__ import annotations

from dataclasses import replace

from pitstop.findings import Finding, Severity
from pitstop.measure import Interval, speedup_interval
from pitstop.profile.confirm import judged
from pitstop.profile.timeline import Breakdown, StepRecord
from pitstop.recipes import recipe

MIN_PER_BLOCK = 3
MAX_BLOCKS = 8

# finding id -> the part of the step its fix removes
WORKERS = recipe("workers").finding or "dataloader.workers"
PART_OF: dict[str, str] = {WORKERS: "data_wait_s"}
# findings whose fix moves the work to other processes on the same cores
SHARES_CORES = frozenset({WORKERS})


def blocks(steps: list[StepRecord]) -> list[list[StepRecord]]:
    """``steps`` in contiguous blocks of nearly equal size (the first ones one step longer)."""
    k = min(MAX_BLOCKS, len(steps) // MIN_PER_BLOCK)
    if k < 1:
        return []
    size, extra = divmod(len(steps), k)
    out, i = [], 0
    for b in range(k):
        n = size + (1 if b < extra else 0)
        out.append(steps[i : i + n])
        i += n
    return out


def without_part(steps: list[StepRecord], part: str) -> Interval | None:
    """Speed-up of the steps with ``part`` removed over the steps as they are, block by block."""
    bl = blocks(steps)
    base = [[s.total_s for s in b] for b in bl]
    cand = [[max(s.total_s - getattr(s, part), 1e-9) for s in b] for b in bl]
    return speedup_interval(base, cand)


def saving_bounds(iv: Interval | None, step_s: float) -> tuple[float, float] | None:
    """The per-step saving that the speed-up interval ``iv`` means on a ``step_s`` step."""
    if iv is None or iv.rounds < 2 or step_s <= 0 or iv.lo <= 0:
        return None
    return step_s * (1 - 1 / iv.lo), step_s * (1 - 1 / iv.hi)


def confirm(f: Finding, steps: list[StepRecord], bd: Breakdown, device: str = "cpu") -> Finding:
    """``f`` judged by the interval of the part of the step its fix removes (findings not in
    ``PART_OF`` are returned as they are); on a CPU-only ``device`` the lower bound shares the cores."""
    part = PART_OF.get(f.id)
    if part is None or f.severity is Severity.PASS or f.est_saving_s is None:
        return f
    iv = without_part(steps, part)
    bounds = saving_bounds(iv, bd.median_total_s)
    if iv is not None and bounds is not None:
        bounds = (min(bounds[0], f.est_saving_s), max(bounds[1], f.est_saving_s))
        note = f"; the saving's interval from {iv.rounds} blocks of the run's steps"
        cores = int(f.data.get("usable_cores") or 0)
        if f.id in SHARES_CORES and device.split(":")[0] == "cpu" and cores > 0:
            bounds = (max(0.0, bounds[0]) * (1 - 1 / cores), bounds[1])
            note += f", its lower bound leaving 1/{cores} of the wait (the workers share the cores)"
        f = replace(f, evidence=f.evidence + note)
    why = (
        f"no interval: {len(steps)} measured steps make fewer than 2 blocks of {MIN_PER_BLOCK}"
        if bounds is None
        else ""
    )
    out = judged(f, bounds, bd.median_total_s, why)
    if iv is not None and bounds is not None:
        out.data["saving_blocks"] = iv.rounds
    return out


def apply(found: list[Finding], steps: list[StepRecord], bd: Breakdown, device: str = "cpu") -> list[Finding]:
    """Every finding in ``PART_OF`` confirmed by its interval over ``steps``, or demoted to info."""
    return [confirm(f, steps, bd, device) for f in found]
