"""Do profile's predictions come true? Each prediction's saving next to what `pitstop fix` measured.

For each script:
  1. `pitstop profile` (probes on, and the two-process page-fault timing where its prediction would
     warn) gives its findings. Every finding that has a fix `fix` can inject (`tune.fix.FINDING_KINDS`)
     and a predicted saving, warning or info, is a row: predicted speed-up = median step / (median step -
     saving), with the saving's 95% interval where it has one (`data.saving_ci_s`).
  2. `pitstop fix --candidates KIND` times that fix against the script as it is (interleaved child runs,
     `pitstop.measure`): measured speed-up with its 95% interval and verdict.
  3. The row says whether the measured speed-up lies inside the predicted interval, and whether the
     fix measured below 1.0x (the upper bound under 1).

Targets (issue: findings you can bank on): every warning's measured speed-up inside its predicted
interval, and no warning's fix below 1.0x. Writes benchmarks/results/calibration.md with the machine's
load (other processes' CPU share) measured over the run.

    flock /tmp/pitstop-bench.lock .venv/bin/python benchmarks/calibration.py [--scripts mnist_style,conv_fp32]
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "calibration.md"

# script -> arguments that keep one run short and let it run past the measured steps
SCRIPTS: dict[str, list[str]] = {
    "mnist_style": ["--epochs", "50"],
    "conv_fp32": ["--batch-size", "16", "--size", "32", "--steps", "100000"],
    "slow_loader": ["--batch-size", "8", "--images", "48", "--steps", "100000"],
    "item_sync": ["--steps", "100000"],
    "word_lm": ["--epochs", "50"],
    "imagenet_style": ["--dummy", "--epochs", "50"],
    "healthy": ["--steps", "100000"],
}


def rows_for(name: str, args: argparse.Namespace) -> tuple[list[dict[str, Any]], str | None]:
    from pitstop.profile.malloc_confirm import maybe_confirm
    from pitstop.profile.runner import RunSpec, run
    from pitstop.profile.verify import predicted_speedup
    from pitstop.tune.fix import FINDING_KINDS, FixConfig, run_fix

    cmd = [sys.executable, f"examples/{name}.py", *SCRIPTS[name]]
    spec = RunSpec(cmd, steps=args.steps, warmup=args.warmup, timeout=600, cwd=str(ROOT), quiet=True)
    print(f"{name}: profile", file=sys.stderr, flush=True)
    prof = run(spec)
    if not prof.ok:
        return [], prof.error or prof.status
    maybe_confirm(spec, prof)
    report = prof.report()
    step_s = float((report.sections.get("breakdown") or {}).get("median_step_s") or 0.0)
    rows = []
    for f in report.ranked():
        kind = FINDING_KINDS.get(f.id)
        if kind is None or f.severity.rank < 1 or not f.est_saving_s:
            continue
        point, bounds = predicted_speedup(f, step_s)
        print(f"{name}: fix --candidates {kind} ({f.id}, {f.severity})", file=sys.stderr, flush=True)
        cfg = FixConfig(
            candidates=(kind,), budget=args.budget, steps=args.steps, warmup=args.warmup, cwd=str(ROOT)
        )
        result = run_fix(cmd, cfg)
        m = next((c for c in result.candidates if c.kind == kind), None)
        iv = m.interval if m else None
        rows.append(
            {
                "script": name,
                "finding": f.id,
                "severity": str(f.severity),
                "predicted": point,
                "predicted_ci": bounds,
                "measured": iv.estimate if iv else None,
                "measured_text": iv.text()
                if iv
                else (m.reason if m else "; ".join(result.skipped_candidates)),
                "verdict": m.verdict if m else "not measured",
                "inside": bool(iv and bounds and bounds[0] <= iv.estimate <= bounds[1]),
                "below_one": bool(iv and iv.hi < 1.0),
            }
        )
    return rows, None


def fmt_pred(r: dict[str, Any]) -> str:
    if r["predicted"] is None:
        return "—"
    ci = r["predicted_ci"]
    return f"{r['predicted']:.2f}x" + (f" (95% CI {ci[0]:.2f}–{ci[1]:.2f})" if ci else " (no interval)")


def main() -> int:
    from pitstop.host.load import OtherCpu, load_average

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scripts", default=",".join(SCRIPTS), help="comma list of examples/ scripts")
    ap.add_argument("--budget", type=float, default=150.0, help="seconds per fix measurement")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    args = ap.parse_args()
    names = [n for n in args.scripts.split(",") if n]
    start, other, t0 = load_average(), OtherCpu(), time.perf_counter()
    rows: list[dict[str, Any]] = []
    failed: dict[str, str] = {}
    for i, name in enumerate(names):
        got, err = rows_for(name, args)
        rows += got
        if err:
            failed[name] = err
        write(names[: i + 1], rows, failed, args, start, other, t0)  # what is measured so far survives a stop
    return 0


def write(
    names: list[str],
    rows: list[dict[str, Any]],
    failed: dict[str, str],
    args: argparse.Namespace,
    start: float | None,
    other: Any,
    t0: float,
) -> None:
    from pitstop.host.load import load_line

    lines = [
        "## Calibration: predicted saving vs measured speed-up (`benchmarks/calibration.py`)",
        "",
        f"{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC; {load_line(start)}; other processes used "
        f"{other.share():.0%} of the CPUs over the {time.perf_counter() - t0:.0f} s run. Scripts: "
        f"{', '.join(names)}; fix budget {args.budget:.0f} s per row, {args.steps} steps per run.",
        "",
        "| script | finding | severity | predicted speed-up | measured by fix | verdict | inside | < 1.0x |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {r['script']} | `{r['finding']}` | {r['severity']} | {fmt_pred(r)} | {r['measured_text']} | "
            f"{r['verdict']} | {'yes' if r['inside'] else 'no'} | {'yes' if r['below_one'] else 'no'} |"
        )
    if not rows:
        lines.append("| — | no finding with an injectable fix and a predicted saving | | | | | | |")
    warns = [r for r in rows if r["severity"] == "warn"]
    lines += [
        "",
        f"Warnings: {len(warns)}; measured inside the predicted interval: {sum(r['inside'] for r in warns)}; "
        f"measured below 1.0x: {sum(r['below_one'] for r in warns)}.",
    ]
    for name, err in failed.items():
        lines.append(f"- {name}: the profile run failed: {err}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text("\n".join(lines) + "\n")
    print(f"wrote {RESULTS}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
