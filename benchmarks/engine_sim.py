"""Where the width of the engine's interval comes from: a simulation of `pitstop.measure`'s rounds.

Each simulated run is a child process of a script: it pays ``--startup`` seconds of start-up (torch
import, data set, model), then ``warm-up + steps`` steps. A run's steps share one run factor
(log-normal, ``--run-spread``: one process is slower than the next as a whole) and each step has its
own noise (log-normal, ``--step-spread``) plus rare 5x spikes. The engine's real ``interleave`` runs on a
simulated clock, so the budget, the rounds, the outliers, the interval and the sequential verdict are
exactly what `fix` applies; only the timings are made up. For each setting it prints the A/A rates
(helped, hurt: both false), the planted-1.2x decision rate, the share of a planted 1.1x (a real gain
that the 5% margin makes hard to prove) called helped, and the median rounds and interval width.

    .venv/bin/python benchmarks/engine_sim.py --scenarios [--trials 400]

No timing is measured: it needs no lock and its figures do not depend on the machine.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "engine_sim.md"
SCENARIOS = {  # (start-up s, step s, run spread, step spread)
    "child start-up 4 s, 0.1 s steps, 8% run spread": (4.0, 0.1, 0.08, 0.15),
    "child start-up 4 s, 0.1 s steps, 3% run spread": (4.0, 0.1, 0.03, 0.15),
    "child start-up 8 s, 0.02 s noisy steps (30%), 3% run spread": (8.0, 0.02, 0.03, 0.3),
    # examples/mnist_style.py as fix measured it: runs of ~6 s, mostly start-up; per-round log ratios
    # spread 0.14, i.e. ~10% per run
    "child start-up 6 s, 0.012 s steps, 10% run spread (mnist_style)": (6.0, 0.012, 0.10, 0.15),
}


def one(effect: float, steps: int, max_rounds: int, args: argparse.Namespace, rng: random.Random):
    from pitstop.measure import Arm, Settings, interleave

    now = [0.0]
    speed = {"base": 1.0, "cand": effect}

    def sample(name: str) -> tuple[list[float], float]:
        run = math.exp(rng.gauss(0, args.run_spread))
        out = []
        for _ in range(args.warmup + steps):
            s = args.step_s * run / speed[name] * math.exp(rng.gauss(0, args.step_spread))
            out.append(s * 5 if rng.random() < 0.01 else s)
        wall = args.startup + sum(out)
        now[0] += wall
        return out, wall

    base, cand = Arm("base"), Arm("cand")
    s = Settings(budget_s=args.budget, max_rounds=max_rounds, warmup=args.warmup, min_gain=0.05)
    rounds = interleave(base, [cand], sample, s, clock=lambda: now[0])
    iv = cand.interval
    return cand.verdict, rounds, (iv.hi - iv.lo) if iv and math.isfinite(iv.hi) else math.inf


def row(label: str, steps: int, max_rounds: int, args: argparse.Namespace) -> str:
    rng = random.Random(1)
    aa = [one(1.0, steps, max_rounds, args, rng) for _ in range(args.trials)]
    pl = [one(1.2, steps, max_rounds, args, rng) for _ in range(args.trials)]
    small = [one(1.1, steps, max_rounds, args, rng) for _ in range(args.trials)]
    n = args.trials

    def pct(xs, v):
        return 100 * sum(x[0] == v for x in xs) / n

    return (
        f"| {label} | {steps} | {max_rounds} | {pct(aa, 'helped'):.1f}% | {pct(aa, 'hurt'):.1f}% "
        f"| {pct(aa, 'no change'):.0f}% | {pct(pl, 'helped'):.0f}% | {pct(small, 'helped'):.0f}% "
        f"| {statistics.median(x[1] for x in pl):.0f} | {statistics.median(x[2] for x in pl):.3f} |"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=400)
    ap.add_argument("--budget", type=float, default=150.0, help="seconds per comparison (2 arms)")
    ap.add_argument("--startup", type=float, default=4.0, help="seconds of start-up per child run")
    ap.add_argument("--step-s", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--run-spread", type=float, default=0.08, help="sd of a run's log factor")
    ap.add_argument("--step-spread", type=float, default=0.15, help="sd of a step's log noise")
    ap.add_argument(
        "--scenarios", action="store_true", help=f"the built-in scenarios, written to {RESULTS.name}"
    )
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT / "src"))
    from pitstop.measure.plan import steps_for_startup

    runs = (
        list(SCENARIOS.items())
        if args.scenarios
        else [("command line", (args.startup, args.step_s, args.run_spread, args.step_spread))]
    )
    lines = [
        "# Timing engine: where the interval width comes from (simulation, `benchmarks/engine_sim.py`)",
        "",
        f"`pitstop.measure.interleave` on a simulated clock (no timing measured, no machine dependence); "
        f"baseline + 1 candidate, {args.budget:g} s per comparison, {args.warmup} warm-up steps, min_gain 5%, "
        f"{args.trials} A/A, {args.trials} planted-1.2x and {args.trials} planted-1.1x trials per row. Command: "
        f"`.venv/bin/python benchmarks/engine_sim.py {' '.join(sys.argv[1:])}`",
    ]
    for name, (args.startup, args.step_s, args.run_spread, args.step_spread) in runs:
        auto = steps_for_startup(args.startup, args.step_s, args.step_spread, args.run_spread)
        lines += [
            "",
            f"**{name}**",
            "",
            "| setting | steps/run | max rounds | A/A helped | A/A hurt | A/A no change | planted decided "
            "| planted 1.1x helped | median rounds | median width |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
            row("fixed 20 steps, 10 rounds", 20, 10, args),
            row("fixed 20 steps, rounds by budget", 20, 1000, args),
            row("100 steps, rounds by budget", 100, 1000, args),
            row("steps from start-up, rounds by budget", auto, 1000, args),
        ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.scenarios:
        RESULTS.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
