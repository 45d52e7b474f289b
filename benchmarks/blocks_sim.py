"""How often the interval from blocks of steps within runs (`pitstop.measure.within_runs`) calls a change
helped: a simulation of the slow-step case where one round of fresh runs fits the budget.

Each simulated run has its own speed factor (log-normal, the run spread) and AR(1) step noise (lag-1
correlation 0.5: neighbouring steps are alike, which the blocks of 3 are for). For each setting it prints
the share of comparisons whose interval's lower bound clears 1.05 (what decides "helped"): for an A/A
pair (false), a planted 1.1x and a planted 2x. `pitstop.profile.analyze.confirm` decides by this interval only
where the in-process probe's interval agrees, so the false rate of the pair is about the product of the
two; this shows the blocks' own share.

    .venv/bin/python benchmarks/blocks_sim.py [--trials 4000] [--steps 6] [--rounds 1]

No timing is measured: its figures do not depend on the machine.
"""

from __future__ import annotations

import argparse
import math
import random

from pitstop.measure.within_runs import RUN_SPREAD, within_runs_interval


def run(rng: random.Random, mean: float, run_sd: float, step_sd: float, steps: int) -> list[float]:
    factor, e, out = math.exp(rng.gauss(0, run_sd)), 0.0, []
    for _ in range(steps):
        e = 0.5 * e + rng.gauss(0, step_sd)
        out.append(mean * factor * math.exp(e))
    return out


def helped_share(effect: float, run_sd: float, step_sd: float, steps: int, rounds: int, trials: int) -> float:
    rng, hits = random.Random(0), 0
    for _ in range(trials):
        base = [run(rng, 1.0, run_sd, step_sd, steps) for _ in range(rounds)]
        cand = [run(rng, 1.0 / effect, run_sd, step_sd, steps) for _ in range(rounds)]
        iv = within_runs_interval(base, cand)
        hits += iv is not None and iv.lo > 1.05
    return hits / trials


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=4000)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=1)
    a = ap.parse_args()
    print(f"allowance {RUN_SPREAD:.0%} a run; {a.steps} steps a run, {a.rounds} round(s), {a.trials} trials")
    print("| run spread | step spread | A/A helped | 1.1x helped | 2x helped |")
    print("|---|---|---|---|---|")
    for run_sd in (0.05, 0.1, 0.2):
        for step_sd in (0.05, 0.2):
            shares = [helped_share(e, run_sd, step_sd, a.steps, a.rounds, a.trials) for e in (1.0, 1.1, 2.0)]
            print(f"| {run_sd:.0%} | {step_sd:.0%} | " + " | ".join(f"{s:.3f}" for s in shares) + " |")


if __name__ == "__main__":
    main()
