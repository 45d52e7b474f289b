"""How long ``pitstop profile`` takes to answer, and the time budget its fresh confirmation runs share.

The profiled run has three stages, read off its record (``stages``): start-up (launch to the first step:
imports, data, model), the measured window (warm-up and measured steps) and the probes (after the
script stops, in the same process, the MFU's matmul peak included). The start-up is measured once,
there: every fresh confirmation run pays it again, so one round of fresh runs (the script as it is and
with the fix) costs two start-ups plus their steps (``round_s``), known before any runs.

``--budget S`` (default ``DEFAULT_BUDGET_S``) is the time pitstop may add after the script's measured
steps: the probes' time and ``RESERVE_S`` are taken from it and the confirmations share the rest
(``Plan``, ``share``), each at most
its own budget and at least one round where one fits. A confirmation whose round does not fit what is
left is not run, and its finding says so (``skip_record``); one the budget cuts short says how many
rounds fitted (``pitstop.profile.analyze.confirm``). ``Plan.text`` is the line printed before the confirmations:
"answer in about N s: ...; --budget S to change".
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


def skip_record(round_est_s: float, left_s: float, budget_s: float) -> dict[str, Any]:
    """The record of fresh runs not started because one round (``round_est_s``) does not fit the
    ``left_s`` seconds of the budget left: what their finding quotes as why nothing was measured."""
    why = (
        f"not run: one round of fresh runs (the script as it is and with the fix, each paying its "
        f"start-up again) takes about {round_est_s:.0f} s, more than the {max(0.0, left_s):.0f} s left of "
        f"the {budget_s:.0f} s budget; pitstop profile --budget S allows more"
    )
    return {"rounds": 0, "steps_each_side": [0, 0], "budget_s": 0.0, "verdict": None, "errors": [why]}


@dataclass
class Plan:
    """The confirmations' share of the budget: ``planned`` (name, seconds at most) in the order they
    run; ``left_s`` what the probes and ``RESERVE_S`` left of ``budget_s`` (None: no shared budget)."""

    budget_s: float | None
    stages: Stages
    planned: list[tuple[str, float]] = field(default_factory=list)

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
        names = ", ".join(n for n, _ in self.planned)
        confirms = f"confirmations at most {self.confirm_s:.0f} s ({names})" if names else "no confirmations"
        return (
            f"answer in about {total:.0f} s: start-up {st.startup_s:.0f} s, measured window "
            f"{st.window_s:.0f} s, probes {st.probes_s:.0f} s, {confirms}; --budget S to change"
            + (f" (now {self.budget_s:.0f} s)" if self.budget_s is not None else "")
        )

    def to_dict(self) -> dict[str, Any]:
        return {"budget_s": self.budget_s, **self.stages.to_dict(), "planned": dict(self.planned)}


def share(left_s: float, own_budget_s: float, round_est_s: float, waiting: int) -> float | None:
    """Seconds for the next confirmation of ``waiting`` (itself included): an even share of ``left_s``,
    at most its ``own_budget_s``, raised to one round (with a quarter spare) where that fits what is
    left; None when not even one round fits."""
    if round_est_s > left_s:
        return None
    even = left_s / max(1, waiting)
    return min(own_budget_s, left_s, max(even, 1.25 * round_est_s))
