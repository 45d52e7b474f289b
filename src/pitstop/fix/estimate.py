"""How long ``pitstop fix`` will take, said in its first lines, and why.

Once the profile run (or the first baseline run) has given the script's start-up and step time and
the candidates are known, a run costs its start-up plus its warm-up and timed steps, a round one run
of each candidate and of the script as it is, and no verdict comes before ``min_rounds`` rounds. So the
least ``fix`` takes is what has passed plus ``min_rounds`` rounds, and the most is its ``--budget``
(which ends the rounds; a run is never cut below ``runs.MIN_RUN_S``). The start-up is read off the
profiled run as ``pitstop profile`` reads it (``pitstop.profile.confirm.budget.stages``).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from pitstop.profile.runs.runner import RunResult


@dataclass
class FixEstimate:
    """``configs`` runs a round (the candidates and the script as it is), each ``run_s`` seconds."""

    candidates: int
    startup_s: float
    step_s: float
    warmup: int
    steps: int
    min_rounds: int
    budget_s: float
    elapsed_s: float

    @property
    def run_s(self) -> float:
        return self.startup_s + (self.warmup + self.steps) * self.step_s

    @property
    def rounds_s(self) -> float:
        """What has passed plus ``min_rounds`` rounds: when the first verdicts can come."""
        return self.elapsed_s + self.min_rounds * (self.candidates + 1) * self.run_s

    @property
    def least_s(self) -> float:
        """``rounds_s``, at most the budget."""
        return min(self.budget_s, self.rounds_s)

    def text(self) -> str:
        budget = f"{self.budget_s:.0f} s"
        if self.rounds_s >= self.budget_s:  # the budget ends the rounds before the first verdicts' look
            head = f"about {budget} (its --budget; {self.rounds_s:.0f} s for the rounds a verdict needs)"
        else:
            head = f"{self.least_s:.0f} s at least, {budget} at most"
        return (
            f"pitstop fix: {head}: {self.candidates} candidate(s) and your script as it is, at least "
            f"{self.min_rounds} rounds of one run each before a verdict, a run about {self.run_s:.0f} s "
            f"(start-up {self.startup_s:.0f} s + {self.warmup}+{self.steps} steps of "
            f"{self.step_s * 1000:.0f} ms); rounds go on until every verdict is in or the --budget of "
            f"{budget} ends them (--budget S to change)"
        )


def estimate(
    r: RunResult, candidates: int, warmup: int, steps: int, min_rounds: int, budget_s: float, elapsed_s: float
) -> FixEstimate | None:
    """The estimate from run ``r`` of the script; None when it measured no step."""
    from pitstop.profile.confirm.budget import stages

    times = [s.total_s for s in r.steps if not s.eval]
    if not times:
        return None
    step = statistics.median(times)
    return FixEstimate(candidates, stages(r).startup_s, step, warmup, steps, min_rounds, budget_s, elapsed_s)
