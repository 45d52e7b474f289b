"""Predictions read off the run's own steps, given an interval from their spread over the run.

``dataloader.workers`` predicts that loading in worker processes saves the data wait: the step would
take its time minus the wait. That is one number per step, so its interval comes from how the wait
varies over the run: the measured steps are cut into contiguous blocks (at least ``MIN_PER_BLOCK``
steps, at most ``MAX_BLOCKS`` blocks), each block is one round for ``pitstop.measure.speedup_interval``
(its step times against the same steps without their wait, ratio of medians), and the speed-up's
bounds become the saving's: median step x (1 - 1 / speed-up). Blocks rather than steps are the unit
because neighbouring steps are correlated (an epoch boundary, a slow stretch of the disk), as runs
are in ``pitstop.measure``. The finding is then judged as every prediction is
(``pitstop.profile.analyze.confirm.judged``): a warning only when the lower bound is at least ``WARN_SHARE`` of
the median step, else info, not confirmed, with ``saving_ci_s`` in its data either way. ``sync.item``
is read the same way: its fix (one ``.tolist()``, values kept on the device) removes the step's sync
part, the time blocked in the calls and the per-element loop around them.

On a CPU-only run the workers' loading competes with the compute for the same cores, so the lower
bound also allows for the worst case: the compute keeps all ``usable_cores`` busy, the loader's work
(the wait, done in the main process now) is spread over them, and ``1 / cores`` of it stays on the
step's critical path: the sure saving is the wait's lower bound x (1 - 1 / cores). The upper bound
(every second of the wait gone) is the best case, where the compute leaves cores idle.

That model can still promise more than the fix gives (the workers' own overhead, a loader bound by
the CPU). Where the fix was timed in fresh runs of the script (``pitstop.profile.confirm.workers_confirm``:
what ``pitstop profile`` does whenever the prediction would warn), the measurement replaces the model:
the saving and its interval are the measured throughput speed-up's on the run's mean step (what
``pitstop fix`` measures), and runs that measured nothing leave the finding info, saying why.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from pitstop.findings import Finding, Severity
from pitstop.measure import Interval, speedup_interval
from pitstop.profile.analyze.confirm import judged
from pitstop.profile.analyze.rulekit import ms
from pitstop.profile.record.timeline import Breakdown, StepRecord
from pitstop.recipes import recipe

MIN_PER_BLOCK = 3
MAX_BLOCKS = 8

# finding id -> the part of the step its fix removes
WORKERS = recipe("workers").finding or "dataloader.workers"
PART_OF: dict[str, str] = {WORKERS: "data_wait_s", "sync.item": "sync_s"}
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


def measured_in_fresh_runs(f: Finding, two: dict[str, Any], bd: Breakdown) -> Finding:
    """``f`` judged by the fresh runs' measurement of its fix (``two``: ``fresh_runs.timed``'s record)."""
    step = bd.median_total_s
    text = (
        f"; timed in fresh runs of the script, as it is vs num_workers={two.get('num_workers')} "
        f"(persistent), {two.get('rounds', 0)} rounds"
    )
    data = {**f.data, "two_process": two}
    iv = Interval(**two["interval"]) if two.get("interval") else None
    if two.get("throughput"):  # the speed-up a timer sees (fix's measure), on the mean step
        iv, step = Interval(**two["throughput"]), bd.total_s
    if "saving_s" not in two:
        why = f"the fresh runs measured nothing ({'; '.join(two.get('errors') or ['no step'])})"
        f = replace(f, evidence=f.evidence + text, data=data)
        return judged(f, None, step, why)
    if iv is None:  # one round: a point, no interval
        base, new = two["base_s"], two["new_s"]
        speedup = base / new if new > 0 else 1.0
        why = "no interval: fewer than 2 rounds of the fresh runs fitted their budget"
    else:
        speedup = iv.estimate
        why = ""
        kind = " in throughput" if two.get("throughput") else ""
        text += f": {iv.text()}{kind} (median step {ms(two['base_s'])} vs {ms(two['new_s'])})"
    saved = max(0.0, step * (1 - 1 / speedup)) if speedup > 0 else 0.0
    share = min(1.0, saved / bd.total_s) if bd.total_s > 0 else 0.0
    f = replace(f, evidence=f.evidence + text, est_saving_s=saved, share=share, data=data)
    return judged(
        f, saving_bounds(iv, step), step, why or "no interval: the fresh runs' interval is not finite"
    )


def confirm(
    f: Finding,
    steps: list[StepRecord],
    bd: Breakdown,
    device: str = "cpu",
    fresh: dict[str, Any] | None = None,
) -> Finding:
    """``f`` judged by the interval of the part of the step its fix removes (findings not in
    ``PART_OF`` are returned as they are); on a CPU-only ``device`` the lower bound shares the cores.
    ``fresh``: the workers fix timed in fresh runs (``workers_confirm``), which replaces the model."""
    part = PART_OF.get(f.id)
    if part is None or f.severity is Severity.PASS or f.est_saving_s is None:
        return f
    if fresh is not None and f.id == WORKERS:
        return measured_in_fresh_runs(f, fresh, bd)
    iv = without_part(steps, part)
    bounds = saving_bounds(iv, bd.median_total_s)
    if iv is not None and bounds is not None:
        # removing a part of every step cannot slow it: a lower bound under 0 is the t interval's spread
        bounds = (max(0.0, min(bounds[0], f.est_saving_s)), max(bounds[1], f.est_saving_s))
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


def apply(
    found: list[Finding],
    steps: list[StepRecord],
    bd: Breakdown,
    device: str = "cpu",
    fresh: dict[str, Any] | None = None,
) -> list[Finding]:
    """Every finding in ``PART_OF`` confirmed by its interval over ``steps`` (the workers finding by
    ``fresh``, its fix timed in fresh runs, where given), or demoted to info."""
    return [confirm(f, steps, bd, device, fresh) for f in found]
