"""The timing engine's interval from the steps inside runs, for comparisons of slow steps where too few
whole rounds fit the budget (``pitstop.measure`` explains why rounds are the unit otherwise).

A fresh run of a script whose step takes a second holds a handful of measured steps, and a budget holds
one or two rounds of such runs: ``speedup_interval`` has no spread to read from one round and a t on one
degree of freedom from two. The steps inside the runs still say how steady each side was. Neighbouring
steps are correlated (a slow stretch of the machine, the allocator warming), so they are grouped in
batch means: each run's steps cut into consecutive blocks of ``PER_BLOCK``, block ``i`` of the baseline
paired with block ``i`` of the candidate in the same round, and the log ratio of their medians is one
sample. What one run per side cannot show is the run's own factor (one process can be 10-20% slower than
the next): the interval's variance adds ``2 * RUN_SPREAD**2 / rounds`` for it, an allowance rather than
a measurement, so the interval is wider than the blocks alone make it; t takes the Welch-Satterthwaite
degrees of freedom of that sum (the allowance is a constant, the blocks' variance an estimate). Alone,
on one round of 6 steps a side, it calls an A/A pair helped (lower bound above 1.05) in 0-4% of
simulated comparisons where runs spread up to the allowance and 8-13% where they spread twice that
(``benchmarks/blocks_sim.py``). It is meant to corroborate, not to stand alone:
``pitstop.profile.analyze.confirm`` decides by it only where an independent interval (the in-process probe's
rounds) agrees.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from pitstop.measure.engine import Interval, blocks, t_quantile

PER_BLOCK = 3  # steps per batch mean
RUN_SPREAD = 0.10  # standard deviation of a whole run's log speed factor, allowed for, not measured
MAX_DF = 200  # t at this many degrees of freedom is the normal quantile to 3 digits


def within_runs_interval(
    base: Sequence[Sequence[float]],
    cand: Sequence[Sequence[float]],
    confidence: float = 0.95,
    per_block: int = PER_BLOCK,
    run_spread: float = RUN_SPREAD,
) -> Interval | None:
    """Speed-up (baseline over candidate, > 1: faster) from batch means of the steps inside each round's
    runs, widened for the runs' own factors (module doc). ``base[r]``, ``cand[r]``: the kept step times
    of round ``r``'s runs, in order. None when fewer than two blocks pair up."""
    d: list[float] = []
    rounds = steps_base = steps_cand = 0
    for b, c in zip(base, cand, strict=False):
        k = min(len(b), len(c)) // max(1, per_block)
        if k < 1:
            continue
        rounds += 1
        steps_base, steps_cand = steps_base + len(b), steps_cand + len(c)
        d += [
            math.log(statistics.median(bb) / statistics.median(cc))
            for bb, cc in zip(blocks(b, k), blocks(c, k), strict=True)
        ]
    if len(d) < 2:
        return None
    mean = statistics.fmean(d)
    blocks_var = statistics.variance(d) / len(d)
    var = blocks_var + 2 * run_spread**2 / rounds
    # Welch-Satterthwaite: the allowance is known (no degrees of freedom lost), the blocks' part is not
    df = MAX_DF if blocks_var <= 0 else var**2 / (blocks_var**2 / (len(d) - 1))
    half = t_quantile(confidence, int(min(MAX_DF, max(len(d) - 1, df)))) * math.sqrt(var)
    return Interval(
        estimate=math.exp(mean),
        lo=math.exp(mean - half),
        hi=math.exp(mean + half),
        rounds=rounds,
        steps_base=steps_base,
        steps_cand=steps_cand,
        confidence=confidence,
        method="blocks",
    )


__all__ = ["PER_BLOCK", "RUN_SPREAD", "within_runs_interval"]
