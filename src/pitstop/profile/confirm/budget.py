"""How long ``pitstop profile`` takes to answer, and the time budget its fresh confirmation runs share.

The profiled run has three stages, read off its record (``stages``): start-up (launch to the first step:
imports, data, model), the measured window (warm-up and measured steps) and the probes (after the
script stops, in the same process, the MFU's matmul peak included). The start-up is measured once,
there: every fresh confirmation run pays it again, so one round of fresh runs (the script as it is and
with the fix) costs two start-ups plus their steps (``round_s``), known before any runs.

``--budget S`` (default ``DEFAULT_BUDGET_S``) is the time pitstop may add after the script's measured
steps: the probes' time and ``RESERVE_S`` are taken from it and the confirmations share the rest
(``Plan``, ``shares``). They run by what is at stake: the biggest predicted saving (ms a step) first,
and each in that order is given the rounds a verdict needs before the smaller ones get theirs: two
(``INTERVAL_ROUNDS``, with ``SPARE``) where that fits, since one round's interval over rounds is
unbounded; a single round only where the blocks of steps within it can decide (a model probe whose
in-process interval agrees: ``pitstop.profile.analyze.confirm.agreeing_blocks``). One that gets no
such share is not run, and its finding says why (``skip_record``); what is left after every share
goes to the ones that run, in the same order, up to each one's own budget. Each then runs within its
planned seconds plus what the ones before it left unspent (``runtime_share``), never into the
seconds planned for the ones after it, so the plan printed before them stays true. One the budget
cuts short says how many rounds fitted (``pitstop.profile.analyze.confirm``). ``Plan.text`` is the line
printed before the confirmations: "answer in about N s: ...; confirmations at most C s (name s, ...)
in the order they run; --budget S to change".
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

from pitstop.profile.runs.runner import RunResult

DEFAULT_BUDGET_S = 60.0
# kept from the confirmations' share: the report, and a fresh run's stop overrunning its round
RESERVE_S = 5.0
# a fresh run's python/torch import, when the profiled run did not record its launch
IMPORT_S = 3.0
# rounds an interval over rounds needs (one round's is unbounded), and the spare a planned round gets
INTERVAL_ROUNDS, SPARE = 2, 1.25


@dataclass
class Stages:
    """The profiled run's wall time by stage (seconds). ``startup_s``: launch to the first step;
    ``window_s``: first step's start to the last step's end; ``probes_s``: the probes after the run."""

    startup_s: float
    window_s: float
    probes_s: float
    run_s: float

    def to_dict(self) -> dict[str, float]:
        return {k: round(v, 2) for k, v in asdict(self).items()}


def stages(result: RunResult) -> Stages:
    """``result``'s stages from its record: the child's ``launch_s`` (launch to its clock's origin, else
    ``IMPORT_S``) plus its first step's start is the start-up."""
    steps = [*result.warmup_steps, *result.steps]
    launch = result.data.get("launch_s")
    launch = IMPORT_S if launch is None else float(launch)
    if not steps:
        return Stages(result.wall_s, 0.0, float(result.data.get("probes_s") or 0.0), result.wall_s)
    first = min(s.start_s for s in steps)
    last = max(s.start_s + s.total_s for s in steps)
    return Stages(
        startup_s=launch + max(0.0, first),
        window_s=max(0.0, last - first),
        probes_s=float(result.data.get("probes_s") or 0.0),
        run_s=result.wall_s,
    )


def round_s(result: RunResult, steps: int, warmup: int) -> float:
    """One round of fresh runs, estimated from ``result``: two runs (as it is, with the fix), each its
    start-up plus ``warmup + steps`` median steps. 0.0 when the run measured no step."""
    times = [s.total_s for s in result.steps]
    if not times:
        return 0.0
    return 2 * (stages(result).startup_s + (warmup + steps) * statistics.median(times))


def skip_record(
    round_est_s: float, left_s: float, budget_s: float, rounds: int = 1, after_bigger: bool = False
) -> dict[str, Any]:
    """The record of fresh runs not started because the ``rounds`` rounds (of ``round_est_s`` each) a
    verdict needs do not fit the ``left_s`` seconds of the budget left for them: what their finding
    quotes as why nothing was measured. ``after_bigger``: confirmations with bigger predicted savings
    ran or hold planned seconds before this one (so the message may say its seconds are what they left)."""
    if rounds <= 1 or round_est_s > left_s:
        why = (
            f"not run: one round of fresh runs (the script as it is and with the fix, each paying its "
            f"start-up again) takes about {round_est_s:.0f} s, more than the {max(0.0, left_s):.0f} s left of "
            f"the {budget_s:.0f} s budget"
        )
    else:
        after = ", after the confirmations with bigger predicted savings," if after_bigger else ""
        why = (
            f"not run: the {max(0.0, left_s):.0f} s left of the {budget_s:.0f} s budget{after} hold one "
            f"round of fresh runs (about {round_est_s:.0f} s: the script as it is and with the fix, each "
            f"paying its start-up again) but not the {rounds} an interval needs, and one round's interval "
            f"is unbounded: it could not decide"
        )
    why += "; pitstop profile --budget S allows more"
    return {"rounds": 0, "steps_each_side": [0, 0], "budget_s": 0.0, "verdict": None, "errors": [why]}


@dataclass
class Plan:
    """The confirmations' share of the budget: ``planned`` (name, seconds at most; 0.0: runs only on
    what the ones before it leave unspent) in the order they run; ``left_s`` what the probes and
    ``RESERVE_S`` left of ``budget_s`` (None: no shared budget); ``predicted_s`` each one's predicted
    saving a step, the order's key."""

    budget_s: float | None
    stages: Stages
    planned: list[tuple[str, float]] = field(default_factory=list)
    predicted_s: dict[str, float] = field(default_factory=dict)

    @property
    def left_s(self) -> float:
        if self.budget_s is None:
            return float("inf")
        return max(0.0, self.budget_s - self.stages.probes_s - RESERVE_S)

    @property
    def confirm_s(self) -> float:
        return min(self.left_s, sum(s for _, s in self.planned))

    def text(self) -> str:
        st = self.stages
        total = st.run_s + self.confirm_s
        names = ", ".join(
            f"{n} {s:.0f} s" if s > 0 else f"{n} only on time left over" for n, s in self.planned
        )
        confirms = f"confirmations at most {self.confirm_s:.0f} s ({names})" if names else "no confirmations"
        return (
            f"answer in about {total:.0f} s: start-up {st.startup_s:.0f} s, measured window "
            f"{st.window_s:.0f} s, probes {st.probes_s:.0f} s, {confirms}; --budget S to change"
            + (f" (now {self.budget_s:.0f} s)" if self.budget_s is not None else "")
        )

    def to_dict(self) -> dict[str, Any]:
        out = {"budget_s": self.budget_s, **self.stages.to_dict(), "planned": dict(self.planned)}
        if self.predicted_s:
            out["predicted_saving_s"] = {k: round(v, 4) for k, v in self.predicted_s.items()}
        return out


@dataclass(frozen=True)
class Need:
    """What one confirmation asks of the budget: at most ``own_budget_s``; ``round_s`` a round of its
    fresh runs; ``min_rounds`` the rounds its verdict needs (1 where the blocks within one round can
    decide, else ``INTERVAL_ROUNDS``)."""

    own_budget_s: float
    round_s: float
    min_rounds: int = INTERVAL_ROUNDS

    def seconds(self, rounds: int) -> float | None:
        """Seconds for ``rounds`` rounds with ``SPARE``, at most its own budget; None where that budget
        does not hold the rounds themselves."""
        s = min(self.own_budget_s, SPARE * rounds * self.round_s)
        return s if s >= rounds * self.round_s else None


def shares(left_s: float, needs: list[Need]) -> list[float | None]:
    """Seconds for each of ``needs`` (in the order they run: biggest predicted saving first) out of
    ``left_s``: first each in turn gets ``INTERVAL_ROUNDS`` rounds where they fit what is left, else its
    ``min_rounds`` where those fit, else None (not run); then what is left goes to those that run, in
    the same order, up to each one's own budget."""
    out: list[float | None] = []
    left = left_s
    for n in needs:
        got = None
        for rounds in dict.fromkeys((max(INTERVAL_ROUNDS, n.min_rounds), n.min_rounds)):  # most first
            if (s := n.seconds(rounds)) is not None and s <= left:
                got = s
                break
        out.append(got)
        left -= got or 0.0
    for i, n in enumerate(needs):
        got = out[i]
        if got is not None and left > 0:
            more = min(left, max(0.0, n.own_budget_s - got))
            out[i], left = got + more, left - more
    return out


def runtime_share(own_budget_s: float, left_now_s: float, later_planned_s: float) -> float:
    """Seconds a confirmation may take when its turn comes: what is left of the confirmations' budget
    now (``left_now_s``) less the ``later_planned_s`` seconds planned for the ones after it, i.e. its
    planned share plus what the ones before it left unspent, at most its own budget."""
    return max(0.0, min(own_budget_s, left_now_s - later_planned_s))
