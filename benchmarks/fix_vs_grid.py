"""`pitstop fix`'s chosen configuration vs an exhaustive grid of the same fixes, on the planted examples.

For each example:
  1. `pitstop fix` (auto mode: profile, candidates from its findings, interleaved runs; torch.compile
     skipped: minutes per run here) picks a configuration and reports its measured speed-up.
  2. Every combination of the grid's overrides (e.g. num_workers in {0, 2, 4} x autocast off/bf16) is run
     in `--repeats` rounds of the timing engine (rotating order, per-step samples), in the same session,
     including the unmodified baseline; each cell gets its interval over the baseline.
  3. The table gives the grid's best configuration, where fix's choice ranks in the grid, its steps/s
     relative to the grid's best (both measured in the grid runs), and how many script runs each needed.

Writes benchmarks/results/fix_vs_grid.md.

    flock /tmp/pitstop-bench.lock .venv/bin/python benchmarks/fix_vs_grid.py [--repeats 5] [--examples slow_loader]
"""

from __future__ import annotations

import argparse
import datetime as dt
import itertools
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "fix_vs_grid.md"

# example -> (script arguments that keep one run short, the grid's axes)
EXAMPLES: dict[str, tuple[list[str], dict[str, list[Any]]]] = {
    "slow_loader": (
        ["--batch-size", "8", "--images", "48", "--steps", "100000"],
        {"num_workers": [0, 2, 4], "autocast": [None, "bfloat16"]},
    ),
    "conv_fp32": (
        ["--batch-size", "16", "--size", "32", "--steps", "100000"],
        {"autocast": [None, "bfloat16"], "channels_last": [False, True]},
    ),
}


def env(args: argparse.Namespace) -> dict[str, str]:
    """--threads N pins OpenMP/MKL threads in every run (the same for baseline, candidates and grid)."""
    if not args.threads:
        return {}
    return {"OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads)}


def overrides_for(cell: dict[str, Any]) -> Any:
    from pitstop.profile.record.overrides import Overrides

    ov = Overrides()
    if cell.get("num_workers"):
        ov.dataloader = {"num_workers": cell["num_workers"], "persistent_workers": True}
    ov.autocast = cell.get("autocast")
    ov.channels_last = bool(cell.get("channels_last"))
    return ov


def cell_of(ov: dict[str, Any]) -> dict[str, Any]:
    """A fix result's overrides (dict form) -> the grid's coordinates."""
    return {
        "num_workers": (ov.get("dataloader") or {}).get("num_workers", 0),
        "autocast": ov.get("autocast"),
        "channels_last": bool(ov.get("channels_last")),
    }


def label(cell: dict[str, Any], axes: dict[str, list[Any]]) -> str:
    return ", ".join(f"{k}={cell.get(k)}" for k in axes) or "baseline"


def run_grid(
    cmd: list[str], axes: dict[str, list[Any]], args: argparse.Namespace, steps: int
) -> dict[str, dict[str, Any]]:
    """Every cell ``--repeats`` times in the timing engine's rotating rounds (``pitstop.measure``), each
    run's per-step times as that round's samples; every round runs (no early stop). Each cell carries the
    engine's arm (its rounds) and its interval over the unmodified baseline."""
    from pitstop.measure import Arm, Settings, interleave
    from pitstop.profile.runs.runner import RunSpec, run

    cells = [dict(zip(axes, values, strict=True)) for values in itertools.product(*axes.values())]
    by = {label(c, axes): c for c in cells}
    names = list(by)
    runs: dict[str, list[float]] = {n: [] for n in names}
    failures: dict[str, list[str]] = {}
    count = [0]

    def sample(name: str) -> list[float] | None:
        count[0] += 1
        print(f"  grid run {count[0]}/{len(names) * args.repeats}: {name}", file=sys.stderr, flush=True)
        spec = RunSpec(cmd, steps=steps, warmup=args.warmup, overrides=overrides_for(by[name]), probes=False,
                       quiet=True, timeout=600, cwd=str(ROOT), env=env(args))  # fmt: skip
        res = run(spec)
        if not (res.ok and res.steps):
            failures.setdefault(name, []).append(res.error or res.status)
            return None
        runs[name].append(res.steps_per_s())
        return [s.total_s for s in res.steps if not s.eval]

    arms = {n: Arm(n) for n in names}
    settings = Settings(budget_s=float("inf"), min_rounds=args.repeats + 1, max_rounds=args.repeats)
    interleave(arms[names[0]], [arms[n] for n in names[1:]], sample, settings)
    return {
        n: {
            "cell": by[n],
            "arm": arms[n],
            "runs": runs[n],
            "median": 1.0 / statistics.median(kept)
            if (kept := [v for r in arms[n].rounds for v in r])
            else None,
            "interval": arms[n].interval,
            "failed": failures.get(n, []),
        }
        for n in names
    }


def bench_example(name: str, args: argparse.Namespace) -> dict[str, Any]:
    from pitstop.fix import FixConfig, run_fix

    script_args, axes = EXAMPLES[name]
    cmd = [sys.executable, f"examples/{name}.py", *script_args]
    print(f"{name}: pitstop fix", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    cfg = FixConfig(
        steps=args.steps,  # None: fix's own choice from the start-up
        warmup=args.warmup,
        budget=args.budget,
        skip=("compile",),
        cwd=str(ROOT),
        env=env(args),
    )
    fix = run_fix(cmd, cfg, progress=lambda m: print(f"  {m}", file=sys.stderr, flush=True))
    fix_s = time.perf_counter() - t0
    fix_runs = (
        1
        + sum(len(m.arm.run_s) for m in [fix.baseline, *fix.candidates])
        + (
            # the combination's rounds: it, the single fix, and as many baseline runs as the single fix's
            2 * len(fix.final_single.arm.run_s) + len(fix.combined.arm.run_s)
            if fix.combined and fix.final_single
            else 0
        )
    )
    chosen = [m for m in fix.candidates if m.name in fix.chosen]
    merged: dict[str, Any] = {}
    for m in chosen:
        for k, v in m.overrides.items():
            if v:
                merged[k] = v
    chosen_cell = {k: v for k, v in cell_of(merged).items() if k in axes}
    print(f"{name}: exhaustive grid", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    steps = args.steps or fix.settings.get("steps") or 20  # the grid runs what fix ran
    grid = run_grid(cmd, axes, args, steps)
    grid_s = time.perf_counter() - t0
    base_label = label({k: v[0] for k, v in axes.items()}, axes)
    base = grid.get(base_label, {}).get("median")
    ranked = sorted((g for g in grid.values() if g["median"]), key=lambda g: -g["median"])
    best = ranked[0] if ranked else {"cell": {}, "median": None}
    chosen_label = label({**{k: v[0] for k, v in axes.items()}, **chosen_cell}, axes)
    chosen_in_grid = grid.get(chosen_label)
    rank = next((i + 1 for i, g in enumerate(ranked) if label(g["cell"], axes) == chosen_label), None)
    from pitstop.measure import speedup_interval

    # the chosen cell's speed over the grid's best, per round (1.0 when it is the best)
    vs_best = (
        speedup_interval(best["arm"].rounds, chosen_in_grid["arm"].rounds)
        if chosen_in_grid and ranked and chosen_in_grid is not best
        else None
    )
    within = None
    if chosen_in_grid and ranked:
        within = chosen_in_grid is best or (vs_best is not None and vs_best.hi >= 0.95)
    return {
        "example": name,
        "fix_chosen": " + ".join(fix.chosen) or "nothing (no candidate helped)",
        "fix_candidates": ", ".join(f"{m.name}: {m.verdict}" for m in fix.candidates) or "none",
        "fix_speedup": fix.speedup,
        "chosen_label": chosen_label,
        "chosen_vs_best": chosen_in_grid["median"] / best["median"]
        if chosen_in_grid and chosen_in_grid["median"] and best["median"]
        else None,
        "chosen_rank": rank,
        "chosen_vs_best_interval": vs_best.text() if vs_best else ("it is the best" if within else "–"),
        "within_5pct": within,
        "fix_interval": fix.interval.text() if fix.interval else "–",
        "grid_best_interval": (
            best["interval"].text()
            if ranked and best.get("interval")
            else (
                "1.00x (the baseline is the best)"
                if ranked and best["cell"] == grid[base_label]["cell"]
                else "–"
            )
        ),
        "steps": steps,
        "grid_best": label(best["cell"], axes) if ranked else "– (every grid run failed)",
        "grid_best_speedup": best["median"] / base if base and best["median"] else None,
        "grid_size": len(ranked),
        "fix_runs": fix_runs,
        "grid_runs": len(grid) * args.repeats,
        "fix_s": fix_s,
        "grid_s": grid_s,
        "grid": {k: v["runs"] for k, v in grid.items()},
        "grid_failed": {k: v["failed"] for k, v in grid.items() if v["failed"]},
    }


def fmt(v: Any, spec: str = ".2f") -> str:
    return "–" if v is None else format(v, spec)


def write_results(rows: list[dict[str, Any]], args: argparse.Namespace) -> str:
    from pitstop.host.load import load_line
    from pitstop.host.machine import machine_line

    steps_used = ", ".join(f"{r['example']}: {r['steps']}" for r in rows)
    lines = [
        "# fix vs exhaustive grid",
        "",
        f"Machine: {machine_line()}; {load_line(args.load0)}.  ",
        f"Date: {dt.datetime.now(dt.UTC).strftime('%Y-%m-%d %H:%M UTC')}  ",
        f"Command: `{' '.join(['.venv/bin/python', 'benchmarks/fix_vs_grid.py', *sys.argv[1:]])}`  ",
        f"Each run: {args.warmup} warm-up + the measured optimizer steps `fix` ran "
        f"({steps_used}) of the unmodified example; the grid "
        f"is {args.repeats} rounds of the timing engine (`pitstop.measure`: rotating order, per-step "
        "samples, 95% interval of the per-round ratio of medians). `fix` in auto mode with its default "
        f"settings, budget {args.budget:g} s, torch.compile skipped."
        + (f" OMP/MKL threads per run: {args.threads}." if args.threads else "")
        + " Within 5%: the interval of fix's choice over the grid's best reaches 0.95 (or it is the best).",
        "",
        "| example | fix chose | fix's speed-up (its runs) | grid best | grid best vs baseline | fix's choice vs grid best "
        "(grid runs) | within 5% | rank of fix's choice | script runs: fix / grid | wall s: fix / grid |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        within = {True: "yes", False: "no", None: "–"}[r["within_5pct"]]
        lines.append(
            f"| {r['example']} | {r['fix_chosen']} | {r['fix_interval']} | {r['grid_best']} | "
            f"{r['grid_best_interval']} | {fmt(r['chosen_vs_best'])} ({r['chosen_vs_best_interval']}) | "
            f"{within} | {r['chosen_rank']}/{r['grid_size']} | "
            f"{r['fix_runs']} / {r['grid_runs']} | {r['fix_s']:.0f} / {r['grid_s']:.0f} |"
        )
    lines += ["", "Per-configuration steps/s (each grid run):", ""]
    for r in rows:
        lines.append(f"- **{r['example']}** (fix's candidates: {r['fix_candidates']})")
        for k, v in r["grid"].items():
            failed = r["grid_failed"].get(k)
            note = f" (failed runs: {'; '.join(failed)})" if failed else ""
            lines.append(f"  - {k}: " + ", ".join(f"{x:.3g}" for x in v) + note)
    text = "\n".join(lines) + "\n"
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(text)
    return text


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--examples", default=",".join(EXAMPLES), help="comma list of " + ", ".join(EXAMPLES))
    ap.add_argument("--repeats", type=int, default=5, help="rounds of the grid (runs per cell)")
    ap.add_argument("--budget", type=float, default=300.0, help="pitstop fix's budget per example (s)")
    ap.add_argument("--steps", type=int, default=None, help="steps per run (default: fix's own choice)")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument(
        "--threads",
        type=int,
        default=None,
        help="OMP/MKL threads per run (default: as the environment has it)",
    )
    args = ap.parse_args()
    from pitstop.host.load import load_average

    args.load0 = load_average()
    names = [n.strip() for n in args.examples.split(",") if n.strip()]
    unknown = [n for n in names if n not in EXAMPLES]
    if unknown:
        ap.error(f"unknown example(s): {', '.join(unknown)}")
    rows = []
    try:
        for name in names:
            rows.append(bench_example(name, args))
    except KeyboardInterrupt:
        print("interrupted: writing what was measured", file=sys.stderr)
    print(write_results(rows, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
