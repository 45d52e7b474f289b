"""Calibration of the timing engine `pitstop fix` judges with (`pitstop.measure`): how often it calls
noise a gain, and how often it decides a real one.

Both tests time small in-process step functions through the engine exactly as `fix` times child runs,
with `fix`'s default settings (``FixConfig``: warm-up, steps per run from the start-up, min and max
rounds, min_gain): rotating rounds of runs, each run's steps timed one by one, outliers dropped, the
per-round ratio of medians turned into a 95% interval, and the sequential rule applied after every
round (helped / hurt / no change, else undecided when `--budget` is spent). Each run is charged
`--startup` seconds on the engine's clock, as a child process pays its torch import and set-up, so the
budget buys as many rounds as it would in `fix`.

1. **A/A**: the candidate is the baseline's own step function. Called *helped* in at most 1 of
   `--aa-repeats` (20) comparisons is the target (false-positive rate <= 5%).
2. **Planted 1.2x**: the candidate does 5/6 of the baseline's work per step (the same matmuls, one fewer
   of six). Decided (helped) in at least 9 of `--planted-repeats` (10) is the target.

A step is `units` multiplications of two 192x192 float32 matrices on one thread. Runs here are blocks of
steps in one process, not fresh processes: the run-to-run spread of process start-up, memory placement
and page cache that `fix`'s child runs have is not in these numbers, only the machine's own noise (other
load, frequency, cache). The figures therefore say how the decision rule behaves on real timing noise of
this machine; the spread of child runs on a given script is shown by `fix`'s own intervals.

    flock /tmp/pitstop-bench.lock .venv/bin/python benchmarks/fix_calibration.py [--aa-repeats 20] [--planted-repeats 10]
"""

from __future__ import annotations

import argparse
import datetime as dt
import math
import shlex
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "fix_calibration.md"
N = 192
BASE_UNITS, PLANTED_UNITS = 6, 5


def step_fn(units: int) -> Any:
    import torch

    a, b = torch.randn(N, N), torch.randn(N, N)

    def step() -> None:
        x = a
        for _ in range(units):
            x = torch.mm(x, b) * 0.01
        float(x[0, 0])

    return step


def compare(cand_units: int, args: argparse.Namespace) -> tuple[str, Any, int, int]:
    """One comparison through the engine: (verdict, interval, rounds, steps per run).

    As in `fix`: the steps per run come from a first baseline run (``measure.plan.steps_for_startup`` of
    ``--startup`` and its step time and spread) unless ``--steps`` is given; every run is charged
    ``--startup`` seconds on the engine's clock (not slept), so the budget buys the rounds it buys `fix`
    for a script with that start-up."""
    from pitstop.measure import Arm, Settings, interleave
    from pitstop.measure.plan import log_spread, steps_for_startup

    fns = {"base": step_fn(BASE_UNITS), "cand": step_fn(cand_units)}
    charged = [0.0]

    def block(f: Any, n: int) -> list[float]:
        out = []
        for _ in range(n):
            t0 = time.perf_counter()
            f()
            out.append(time.perf_counter() - t0)
        charged[0] += args.startup
        return out

    first = block(fns["base"], args.warmup + 20)[args.warmup :]
    steps = args.steps or steps_for_startup(
        args.startup, statistics.median(first), step_spread=max(log_spread(first), 0.02)
    )

    def sample(name: str) -> list[float]:
        return block(fns[name], args.warmup + steps)

    base, cand = Arm("base"), Arm("cand")
    settings = Settings(
        budget_s=args.budget,
        min_rounds=args.min_rounds,
        max_rounds=args.max_rounds,
        min_gain=args.min_gain,
        warmup=args.warmup,
    )
    rounds = interleave(base, [cand], sample, settings, clock=lambda: time.monotonic() + charged[0])
    return str(cand.verdict), cand.interval, rounds, steps


def series(label: str, units: int, repeats: int, args: argparse.Namespace) -> dict[str, Any]:
    verdicts, intervals, rounds, steps = [], [], [], []
    for i in range(repeats):
        v, iv, r, m = compare(units, args)
        verdicts.append(v)
        intervals.append(iv)
        rounds.append(r)
        steps.append(m)
        print(f"{label} {i + 1}/{repeats}: {v}, {iv.text() if iv else 'no interval'}", flush=True)
    return {"verdicts": verdicts, "intervals": intervals, "rounds": rounds, "steps": steps}


def _row(name: str, target: str, s: dict[str, Any], rate_of: str) -> str:
    c = Counter(s["verdicts"])
    n = len(s["verdicts"])
    est = [iv.estimate for iv in s["intervals"] if iv]
    width = [iv.hi - iv.lo for iv in s["intervals"] if iv]
    return (
        f"| {name} | {n} | {c['helped']} | {c['hurt']} | {c['no change']} | {c['undecided']} | "
        f"{rate_of}: {100 * c[rate_of] / n if rate_of != 'decided' else 100 * (n - c['undecided']) / n:.0f}% "
        f"| {target} | {statistics.median(s['rounds']):.0f} | "
        f"{statistics.median(est):.3f}x | {statistics.median(width):.3f} |"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--aa-repeats", type=int, default=20)
    ap.add_argument("--planted-repeats", type=int, default=10)
    sys.path.insert(0, str(ROOT / "src"))
    from pitstop.fix.core import FixConfig

    fix = FixConfig()  # the settings `pitstop fix` runs with by default
    ap.add_argument("--steps", type=int, default=fix.steps, help="timed steps per run (default: as fix)")
    ap.add_argument("--warmup", type=int, default=fix.warmup)
    ap.add_argument("--min-rounds", type=int, default=fix.min_rounds)
    ap.add_argument("--max-rounds", type=int, default=fix.max_rounds)
    ap.add_argument("--min-gain", type=float, default=fix.min_gain)
    ap.add_argument(
        "--startup", type=float, default=4.0, help="seconds of start-up charged per run (a child's import)"
    )
    ap.add_argument(
        "--budget", type=float, default=90.0, help="seconds per comparison, start-up charges included"
    )
    args = ap.parse_args()
    import torch

    from pitstop.host.load import OtherCpu, load_average, load_line
    from pitstop.host.machine import machine_line

    torch.set_num_threads(1)
    load0, other = load_average(), OtherCpu()
    t0 = time.monotonic()
    aa = series("A/A", BASE_UNITS, args.aa_repeats, args)
    planted = series("planted 1.2x", PLANTED_UNITS, args.planted_repeats, args)
    wall = time.monotonic() - t0
    aa_helped = Counter(aa["verdicts"])["helped"]
    decided = sum(v == "helped" for v in planted["verdicts"])

    all_steps = aa["steps"] + planted["steps"]
    steps_text = (
        str(all_steps[0])
        if min(all_steps) == max(all_steps)
        else f"{min(all_steps)}-{max(all_steps)} (from the start-up)"
    )
    command = "flock /tmp/pitstop-bench.lock .venv/bin/python benchmarks/fix_calibration.py"
    if sys.argv[1:]:
        command += " " + shlex.join(sys.argv[1:])
    lines = [
        "# fix: calibration of the timing engine (A/A false positives, planted 1.2x decisions)",
        "",
        f"- machine: {machine_line()}",
        f"- date: {dt.datetime.now(dt.UTC).isoformat(timespec='seconds')}",
        f"- command: `{command}`",
        f"- method: `pitstop.measure` rounds with `fix`'s default settings (rotating order, {args.warmup} "
        f"warm-up + {steps_text} timed steps per run, MAD outliers, per-round ratio of medians with a 95% "
        f"Student t interval (99% for the hurt rule and for the last look's helped rule), decided after each round from round "
        f"{args.min_rounds}, at most {args.max_rounds} rounds, min_gain {100 * args.min_gain:.0f}%, "
        f"{args.budget:g} s per comparison with {args.startup:g} s of start-up charged per run); a step is "
        f"{BASE_UNITS} matmuls of {N}x{N} float32 on one thread, the planted candidate {PLANTED_UNITS} of "
        "them (1.2x). Runs are blocks of steps in one process, not fresh processes: the start-up is "
        "charged to the budget but the child runs' placement spread is not in these figures",
        f"- {load_line(load0)}; other processes used {100 * other.share():.0f}% of the machine's CPU "
        f"time during the {wall:.0f} s run (the machine is shared: the figures were taken under that load)",
        "",
        "| test | comparisons | helped | hurt | no change | undecided | rate | target | median rounds "
        "| median estimate | median interval width |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        _row(
            "A/A (candidate = baseline)",
            f"helped <= {args.aa_repeats // 20} of {args.aa_repeats} (<= 5%)",
            aa,
            "helped",
        ),
        _row(
            "planted 1.2x",
            f"decided >= {math.ceil(0.9 * args.planted_repeats)} of {args.planted_repeats} (>= 90%)",
            planted,
            "decided",
        ),
        "",
        f"A/A false-positive rate (called helped): {aa_helped} of {len(aa['verdicts'])} "
        f"({100 * aa_helped / len(aa['verdicts']):.0f}%); planted 1.2x called helped in {decided} of "
        f"{len(planted['verdicts'])} ({100 * decided / len(planted['verdicts']):.0f}%).",
    ]
    text = "\n".join(lines) + "\n"
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(text)
    print()
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
