"""The timing engine: per-step samples, outliers, interleaved rounds, speed-up intervals, verdicts.

Every "is B faster than A" in pitstop is answered here, in four steps:

1. **Samples** are per-step times in seconds, one list per run of a configuration (a child process of
   the user's script, or a timed block in-process). ``clean`` drops the first ``warmup`` samples of a
   run, then the slow outliers: steps slower than ``median + k * MAD`` of that run (MAD scaled by 1.4826
   so it estimates the standard deviation of normal noise). The first batch after a worker pool starts,
   an epoch boundary or an eval pass costs many times a step; the median and MAD ignore up to half the
   samples being such spikes, where a mean and a standard deviation are dragged by the spikes they
   should find. With ``k = 5`` a sample of pure normal noise loses about 3 in 10 million steps, so
   only real spikes go. The rule is one-sided: a fast step is never dropped. Dropped steps are kept as
   ``Outlier`` records so reports can say what was left out and why.
2. **Rounds**: ``interleave`` runs every configuration once per round, in an order rotated each round,
   so drift of the machine (other load, thermal state, page cache) falls on all of them alike.
3. **Interval**: ``speedup_interval`` takes, for each round, the ratio of medians (baseline median step
   time over candidate median step time, so > 1 means faster) and gives their geometric mean with a
   Student t interval on the log ratios. The round is the unit because the noise comes in runs: steps
   within one process are correlated (one process can be 20% slower than the next), so an interval
   from steps alone (a bootstrap of steps, or a t-test over steps) is far too narrow and calls noise a
   gain. A bootstrap over rounds is the usual cure, but with the 3-12 rounds a budget allows it is too
   narrow as well: it cannot see more spread than the few rounds show, and in a simulation with a 10%
   run-to-run spread it called 8 of 40 A/A pairs helped or hurt (this rule: 4 of 300 helped, 24 hurt).
   Student t with n - 1 degrees of freedom widens the interval for few rounds by exactly the right
   amount when log ratios are normal, and pairing the candidate with the baseline of its own round
   removes slow drift. The interval is a pure function of the samples, so the same samples give the
   same interval. Slow steps, where few rounds fit: ``budget_for_rounds``, ``pitstop.measure.within_runs``.
4. **Verdict** (``decide``), after each round once ``min_rounds`` are in: *helped* when the lower bound is
   above ``1 + min_gain``; *hurt* when the upper bound is below 1; *no change* when the interval lies
   inside ``1 +- min_gain``; otherwise the next round. A candidate still open when the budget ends is
   *undecided*, with its interval, unless the last look's rule decides it (below). Looking after every
   round raises the chance that noise passes once.
   The ``min_gain`` margin pays for that on the helped side: an A/A pair has to show a lower bound above
   1.05, not above 1. The hurt rule has no margin, so it reads the same samples' interval at
   ``hurt_confidence`` (99%) instead: at 95% an A/A pair was called hurt in 5-10% of simulated
   comparisons, at 99% in 0.3-3% (``benchmarks/engine_sim.py``), and a fix that is called hurt one run
   and no change the next is what a user must not see. At the **last look** (the budget or the rounds
   are spent) the helped rule gets the hurt rule's mirror: an interval wholly above 1 at
   ``hurt_confidence`` is *helped*, faster for sure with a gain that may be under ``min_gain``. A real
   1.1x gain on a script whose per-round log ratios spread 0.14 needs ~35 rounds to clear 1.05 at 95%
   but ~17 to clear 1 at 99%, and a single look at 99% adds under 1% to the A/A false positives.
   ``benchmarks/fix_calibration.py`` measures the false-positive rate on real timings.

Where the width comes from. One round's log ratio has variance ``2 * (run_spread**2 + (pi/2) *
step_spread**2 / m)``: each side's run factor (the whole process is faster or slower) plus the noise of
the median of its ``m`` steps; the interval's half-width is ``t(n-1) * sd / sqrt(n)`` over ``n`` rounds.
So the rounds shrink it twice (``sqrt(n)`` and a smaller ``t``: 4.30 at 3 rounds, 2.26 at 10, 2.05 at
30) and the steps only shrink the step term. With a round costing ``start-up + m * step`` per
configuration, the steps per run that make the budget go furthest are
``sqrt((pi/2) * start-up / step) * step_spread / run_spread`` (``steps_for_startup``): a child run whose
start-up (torch import, data, model) is long against a step gets more steps, a cheap one more rounds.
In the simulation (4 s start-up, 0.1 s steps, 8% run spread, 150 s for two arms) a planted 1.2x was
decided in 91% with 20 steps a run and in 60% with 100; with 8 s of start-up against 0.02 s steps and
a noisy step (30% step, 3% run spread) 20 steps decided 80% and the rule's 200 steps 100%. Rounds are
therefore bounded by the budget, not by a small fixed count (``Settings.max_rounds`` is a safety cap).
A variance-component interval that pools the steps of a round would be narrower only by treating the
run factor as known; the between-round spread of the per-round ratios already contains both terms, so
the t interval on them is the pooled estimate, and a narrower one is what called A/A noise a gain.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

MAD_SCALE = 1.4826  # MAD * this = standard deviation, for normal noise
HELPED, HURT, NO_CHANGE, UNDECIDED = "helped", "hurt", "no change", "undecided"
NO_GAIN = "no gain"  # ``against_bar``: the saving's upper bound is under the bar (a pass)


@dataclass(frozen=True)
class Outlier:
    run: int  # index of the run (round) it came from
    index: int  # position of the step in that run's samples
    seconds: float
    why: str  # "warm-up" | "spike" (slower than the threshold)


@dataclass(frozen=True)
class Cleaned:
    kept: list[float]
    outliers: list[Outlier]
    threshold: float | None  # seconds above which a step was a spike (None: too few samples to tell)


def clean(samples: Sequence[float], warmup: int = 0, k: float = 5.0, run: int = 0) -> Cleaned:
    """Drop the first ``warmup`` samples and the slow spikes (> median + k * scaled MAD) of one run."""
    vals = [float(v) for v in samples if math.isfinite(v) and v > 0]
    head, rest = vals[:warmup], vals[warmup:]
    out = [Outlier(run, i, v, "warm-up") for i, v in enumerate(head)]
    if len(rest) < 3:
        return Cleaned(rest, out, None)
    med = statistics.median(rest)
    mad = statistics.median(abs(v - med) for v in rest) * MAD_SCALE
    # a run of identical steps has MAD 0: then a step must be 1% slower than the median to be a spike
    threshold = med + k * max(mad, 0.01 * med)
    kept = []
    for i, v in enumerate(rest):
        if v > threshold:
            out.append(Outlier(run, warmup + i, v, "spike"))
        else:
            kept.append(v)
    return Cleaned(kept, out, threshold)


@dataclass(frozen=True)
class Interval:
    """Speed-up of a candidate over the baseline (> 1: faster), with its Student t interval over rounds."""

    estimate: float
    lo: float
    hi: float
    rounds: int
    steps_base: int
    steps_cand: int
    confidence: float = 0.95
    unit: str = "steps"  # what one sample is: a step, or a block of steps timed together
    method: str = "rounds"  # "rounds": over whole runs; "blocks": blocks of steps inside the runs

    def text(self) -> str:
        """'1.20x (95% CI 1.12–1.28, 6 rounds, 180 steps each side)'."""
        return format_interval(self)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def format_interval(iv: Interval) -> str:
    steps = (
        f"{iv.steps_base} {iv.unit} each side"
        if iv.steps_base == iv.steps_cand
        else f"{iv.steps_cand} vs {iv.steps_base} {iv.unit}"
    )
    n = f"{iv.rounds} round{'' if iv.rounds == 1 else 's'}"
    rounds = n + (", blocks within runs" if iv.method == "blocks" else "")
    if not math.isfinite(iv.hi):
        return f"{iv.estimate:.2f}x (no interval from {rounds}, {steps})"
    return (
        f"{iv.estimate:.2f}x ({100 * iv.confidence:.0f}% CI {iv.lo:.2f}\u2013{iv.hi:.2f}, {rounds}, {steps})"
    )


def t_quantile(confidence: float, df: int) -> float:
    """Two-sided Student t critical value: P(|T| < t) = ``confidence`` with ``df`` degrees of freedom.

    Exact for integer df (Abramowitz & Stegun 26.7.3-4), by bisection; df < 1 (one value): infinite."""
    if df < 1:
        return math.inf

    def central(t: float) -> float:
        th = math.atan(t / math.sqrt(df))
        c2, s = math.cos(th) ** 2, math.sin(th)
        if df % 2 == 0:
            term, total = 1.0, 1.0
            for j in range(2, df, 2):
                term *= c2 * (j - 1) / j
                total += term
            return s * total
        if df == 1:
            return 2 * th / math.pi
        term, total = 1.0, 1.0
        for j in range(3, df, 2):
            term *= c2 * (j - 1) / j
            total += term
        return 2 / math.pi * (th + s * math.cos(th) * total)

    lo, hi = 0.0, 1e7
    for _ in range(200):
        mid = (lo + hi) / 2
        if central(mid) < confidence:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def speedup_interval(
    base: Sequence[Sequence[float]], cand: Sequence[Sequence[float]], confidence: float = 0.95
) -> Interval | None:
    """Speed-up (baseline median step time / candidate median step time) with its interval, from the
    per-round paired log ratios of medians and Student t.

    ``base[r]`` and ``cand[r]`` are the kept step times of round ``r``; rounds where either side has no
    sample are left out. None when no round has both; one round gives the estimate with an unbounded
    interval."""
    d = [
        math.log(statistics.median(b) / statistics.median(c))
        for b, c in zip(base, cand, strict=False)
        if len(b) and len(c)
    ]
    if not d:
        return None
    n = len(d)
    est = math.exp(statistics.fmean(d))
    if n < 2:
        lo, hi = 0.0, math.inf
    else:
        half = t_quantile(confidence, n - 1) * statistics.stdev(d) / math.sqrt(n)
        lo, hi = math.exp(statistics.fmean(d) - half), math.exp(statistics.fmean(d) + half)
    return Interval(
        estimate=est,
        lo=min(lo, est),
        hi=max(hi, est),
        rounds=n,
        steps_base=sum(len(b) for b, c in zip(base, cand, strict=False) if len(b) and len(c)),
        steps_cand=sum(len(c) for b, c in zip(base, cand, strict=False) if len(b) and len(c)),
        confidence=confidence,
    )


def blocks(samples: Sequence[float], n: int) -> list[list[float]]:
    """One run's samples cut into ``n`` consecutive blocks of (nearly) equal size, in order.

    For callers that hold one run per side (``pitstop compare`` of two reports): block ``i`` of each side
    stands in for round ``i`` of ``speedup_interval``. Blocks of one process share its run factor, so
    the interval covers the drift within the runs, not the spread between runs."""
    xs = list(samples)
    n = max(1, min(n, len(xs)))
    cuts = [round(i * len(xs) / n) for i in range(n + 1)]
    return [xs[cuts[i] : cuts[i + 1]] for i in range(n)]


def decide(
    iv: Interval | None,
    min_gain: float,
    min_rounds: int = 3,
    hurt_iv: Interval | None = None,
    final: bool = False,
) -> str | None:
    """helped / hurt / no change as soon as the interval allows (after ``min_rounds``); else None.

    ``hurt_iv``: the wider interval the *hurt* rule reads instead of ``iv`` (the same samples at a higher
    confidence: that rule has no ``min_gain`` margin to pay for looking after every round). ``final``:
    the last look, when no more rounds will come; a candidate whose ``hurt_iv`` lies wholly above 1 is
    then *helped* too (faster for sure, a gain under ``min_gain`` not excluded), the mirror of the hurt
    rule. It is one look at the stricter confidence, so it adds at most ``1 - hurt_confidence`` to the
    A/A false-positive rate."""
    if iv is None or iv.rounds < min_rounds:
        return None
    if iv.lo > 1 + min_gain:
        return HELPED
    if (hurt_iv or iv).hi < 1:
        return HURT
    if iv.lo >= 1 - min_gain and iv.hi <= 1 + min_gain:
        return NO_CHANGE
    if final and hurt_iv is not None and hurt_iv.lo > 1:
        return HELPED
    return None


def against_bar(lo: float | None, hi: float | None, bar: float) -> str:
    """A saving's verdict against the ``bar`` a fix must clear to be worth making, from the bounds of its
    interval: HELPED when the lower bound clears the bar, NO_GAIN when the upper bound is under it (a
    pass, as decisive as a warning), else UNDECIDED (no interval, or one that straddles the bar)."""
    if lo is None or hi is None or not (math.isfinite(lo) and math.isfinite(hi)):
        return UNDECIDED
    return HELPED if lo >= bar else NO_GAIN if hi < bar else UNDECIDED


# ------------------------------------------------------------------------------------- interleaved rounds


@dataclass
class Arm:
    """One configuration's measurements: kept step times per round, and what was dropped."""

    name: str
    rounds: list[list[float]] = field(default_factory=list)
    outliers: list[Outlier] = field(default_factory=list)
    run_s: list[float] = field(default_factory=list)  # wall seconds per run
    verdict: str | None = None  # None while open; the baseline never gets one
    decided_at: int | None = None  # the round after which it was decided
    interval: Interval | None = None
    left_out: bool = False  # its first run would not fit (``interleave``'s ``fits``): never measured

    @property
    def steps(self) -> int:
        return sum(len(r) for r in self.rounds)

    def add(self, samples: Sequence[float], warmup: int = 0, k: float = 5.0, wall_s: float = 0.0) -> None:
        c = clean(samples, warmup, k, run=len(self.rounds))
        self.rounds.append(c.kept)
        self.outliers.extend(c.outliers)
        self.run_s.append(wall_s)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "verdict": self.verdict,
            "decided_at": self.decided_at,
            "interval": self.interval.to_dict() if self.interval else None,
            "interval_text": self.interval.text() if self.interval else None,
            "steps": self.steps,
            "rounds": len(self.rounds),
            "outliers": [asdict(o) for o in self.outliers],
        }


@dataclass
class Settings:
    budget_s: float = 300.0  # wall time for all rounds of one comparison
    min_rounds: int = 3
    max_rounds: int = 40  # a cap: the budget ends the rounds first on any script worth measuring
    min_gain: float = 0.05
    confidence: float = 0.95
    hurt_confidence: float = 0.99  # of the interval the hurt rule reads (it has no min_gain margin)
    warmup: int = 0  # samples dropped from the start of every run
    k: float = 5.0  # outlier threshold in scaled MADs

    @classmethod
    def every_round(cls, rounds: int) -> Settings:
        """Exactly ``rounds`` rounds: no budget ends them and no verdict stops an arm early (a caller
        that only wants the interval over all of them)."""
        return cls(budget_s=math.inf, min_rounds=rounds + 1, max_rounds=rounds)


@dataclass
class Progress:
    round: int
    max_rounds: int  # the rounds done plus those the budget still holds (at most Settings.max_rounds)
    elapsed_s: float
    eta_s: float | None  # until the last round that fits the budget
    verdicts: dict[str, str | None]
    intervals: dict[str, Interval | None] = field(default_factory=dict)  # each arm's, as of this round

    def text(self) -> str:
        """'round 2/6, ETA 80 s; amp 1.31x [0.92, 1.70]; workers: helped'."""
        arms = [
            f"{n}: {v}" if v else f"{n} {_short(self.intervals.get(n))}" for n, v in self.verdicts.items()
        ]
        eta = f", ETA {self.eta_s:.0f} s" if self.eta_s is not None else ""
        return f"round {self.round}/{self.max_rounds}{eta}" + (f"; {'; '.join(arms)}" if arms else "")


def _short(iv: Interval | None) -> str:
    """A running interval in a progress line: ``1.31x [0.92, 1.70]``; ``?`` before it has one."""
    if iv is None:
        return "?"
    if not math.isfinite(iv.hi):
        return f"{iv.estimate:.2f}x [no interval yet]"
    return f"{iv.estimate:.2f}x [{iv.lo:.2f}, {iv.hi:.2f}]"


Sample = Callable[[str], tuple[Sequence[float], float] | Sequence[float] | None]


def rotated(names: Sequence[str], r: int) -> list[str]:
    """Round ``r``'s order: the list rotated by ``r`` places (every configuration leads in turn)."""
    if not names:
        return []
    s = r % len(names)
    return list(names[s:]) + list(names[:s])


def judge_rounds(
    base: Sequence[Sequence[float]], cand: Sequence[Sequence[float]], s: Settings, final: bool = False
) -> tuple[Interval | None, str | None]:
    """The candidate's interval at ``s.confidence`` and the verdict it allows now (None: not yet), the
    hurt rule (and, with ``final``, the last look's helped rule) reading the same samples at
    ``s.hurt_confidence``."""
    iv = speedup_interval(base, cand, s.confidence)
    strict = speedup_interval(base, cand, s.hurt_confidence) if s.hurt_confidence > s.confidence else None
    return iv, decide(iv, s.min_gain, s.min_rounds, strict, final)


def faster_not_by_margin(iv: Interval | None, min_gain: float) -> bool:
    """A *helped* verdict that came from the last look's rule: the reported (95%) interval does not
    clear ``1 + min_gain``, so the gain is sure but may be under the margin."""
    return iv is not None and iv.lo <= 1 + min_gain


def update_verdicts(base: Arm, arms: Sequence[Arm], s: Settings, round_no: int) -> None:
    """Recompute every open arm's interval and decide it if the interval allows."""
    for a in arms:
        if a.verdict is not None:
            continue
        a.interval, v = judge_rounds(base.rounds, a.rounds, s)
        if v is not None:
            a.verdict, a.decided_at = v, round_no


def interleave(
    base: Arm,
    arms: Sequence[Arm],
    sample: Sample,
    settings: Settings | None = None,
    *,
    clock: Callable[[], float] = time.monotonic,
    on_progress: Callable[[Progress], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    fits: Callable[[str], bool] | None = None,
) -> int:
    """Rotating rounds of ``sample(name)`` over the baseline and the open arms until every arm is decided,
    ``max_rounds`` are done, or the next round would not fit the budget (with no arms, the baseline alone
    runs its rounds). ``sample`` returns the step times of one run (optionally with its wall seconds), or
    None for a run that failed (that round is skipped for its arm). Arms already holding rounds (e.g. a
    baseline run made earlier) keep them: round ``r`` fills ``rounds[r]``. ``fits(name)``: whether a run
    started now would end in time (a caller's deadline); a run that would not is not started. Past the
    first round that ends the rounds (the runs made are kept); in the first it leaves that arm out
    (``Arm.left_out``), but the baseline's first run is always made. Returns the number of complete
    rounds; open arms end ``undecided``."""
    s = settings or Settings()
    start = clock()
    r = min([len(base.rounds), *(len(a.rounds) for a in arms)])
    first = r
    last_round_s: float | None = None
    while r < s.max_rounds:
        open_arms = [a for a in arms if a.verdict is None and not a.left_out]
        if (arms and not open_arms) or (should_stop and should_stop()):
            break
        elapsed = clock() - start
        if last_round_s is not None and elapsed + last_round_s > s.budget_s:
            break
        t0 = clock()
        if not _round(base, open_arms, sample, s, r, clock, fits, first=r == first):
            break
        r += 1
        last_round_s = clock() - t0
        update_verdicts(base, open_arms, s, r)
        if on_progress:
            on_progress(_progress(arms, s, r, clock() - start, last_round_s))
    for a in arms:
        if a.verdict is None and not a.left_out:
            a.interval, v = judge_rounds(base.rounds, a.rounds, s, final=True)
            a.verdict = v or UNDECIDED
            a.decided_at = r if v else None
    return r


def _round(
    base: Arm,
    open_arms: Sequence[Arm],
    sample: Sample,
    s: Settings,
    r: int,
    clock: Callable[[], float],
    fits: Callable[[str], bool] | None,
    first: bool,
) -> bool:
    """Round ``r``: one run of each arm not yet holding it, in the rotated order. False when a run would
    not fit (``interleave``'s ``fits``) outside the first round: the rounds end there."""
    by_name = {a.name: a for a in [base, *open_arms]}
    for name in rotated(list(by_name), r):
        arm = by_name[name]
        if len(arm.rounds) > r:
            continue  # measured before the rounds started
        if fits is not None and not (first and arm is base) and not fits(name):
            if arm.rounds or not first:
                return False
            arm.left_out = True
            continue
        t1 = clock()
        got = sample(name)
        wall = clock() - t1
        if isinstance(got, tuple):
            got, wall = got
        if got is None:
            arm.rounds.append([])
            arm.run_s.append(wall)
        else:
            arm.add(got, s.warmup, s.k, wall)
    return True


def _progress(arms: Sequence[Arm], s: Settings, r: int, elapsed: float, last_round_s: float) -> Progress:
    """Round ``r``'s progress: the rounds the budget still holds, not the cap ("round 2/6, ETA 80 s")."""
    fit = (s.budget_s - elapsed) / max(last_round_s, 1e-9)  # rounds the budget still holds
    left = s.max_rounds - r if fit >= s.max_rounds else min(s.max_rounds - r, max(0, int(fit)))
    verdicts, intervals = {a.name: a.verdict for a in arms}, {a.name: a.interval for a in arms}
    return Progress(r, r + left, elapsed, left * last_round_s, verdicts, intervals)


__all__ = [
    "HELPED",
    "HURT",
    "NO_CHANGE",
    "NO_GAIN",
    "UNDECIDED",
    "Arm",
    "Cleaned",
    "Interval",
    "Outlier",
    "Progress",
    "Settings",
    "against_bar",
    "blocks",
    "clean",
    "decide",
    "faster_not_by_margin",
    "format_interval",
    "interleave",
    "judge_rounds",
    "rotated",
    "speedup_interval",
    "update_verdicts",
]
