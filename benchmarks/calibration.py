"""Do profile's predictions come true? Each prediction's saving next to what `pitstop fix` measured.

For each script:
  1. `pitstop profile` (probes on, and the fresh-run timings where the page-fault, the workers, the
     autocast or the channels_last prediction would warn: `profile.fresh_confirm`) gives its findings. A
     row is every finding with a predicted saving that has a fix `fix` can inject
     (`fix.core.FINDING_KINDS`), a fix applied by hand in the script (`HAND_FIXED`: item_sync's
     `--fixed`), or none at all (`profile.confirm.UNTIMED`: profile shows it as info, and the row says
     why), and is either a warning or an info whose point
     estimate alone would have warned (>= 5% of the step: a prediction profile demoted for want of a
     confirming interval); `--all-info` adds the smaller ones. Predicted speed-up = median step /
     (median step - saving), with the saving's 95% interval (`data.saving_ci_s`).
  2. `pitstop fix --candidates KIND` times that fix against the script as it is, as `profile --verify`
     would (`profile.verify.fix_config`: for workers, the one count the finding suggests): interleaved
     child runs of `--steps` measured steps each, judged by `pitstop.measure` within `--budget`. A
     fix applied by hand is timed the same way: the script as it is vs with `HAND_FIXED`'s arguments,
     in interleaved fresh runs (`profile.fresh_runs`).
  3. The verdict goes to a per-script verdict cache (`fix.verdict_cache`, in a temporary folder) and
     the finding is read back through it as a later `pitstop profile` would show it: a warning whose
     fix measured no change or hurt becomes info with the measurement ("demoted"), as does one whose
     whole measured interval lies below the predicted one (`profile --verify`'s rule).

A row's outcome: *confirmed* (a warning whose fix helped), *demoted* (the product shows it as info,
with the measurement), *open* (undecided within the budget), *info: fix not injectable* (an untimed
finding profile keeps at info); info rows are predictions profile did not confirm, shown as info. Targets (issue: findings you can bank
on): every warning confirmed or demoted, every warning's measured speed-up inside its predicted
interval, and no warning's fix below 1.0x. Writes benchmarks/results/calibration.md with the
machine's load (other processes' CPU share) over the run; the table is rewritten after every script,
so a stopped run keeps what it measured. `--max-minutes` bounds the whole run: fixes that would
start past it are left unmeasured, and say so.

    flock /tmp/pitstop-bench.lock .venv/bin/python benchmarks/calibration.py [--scripts nanogpt_style,slow_loader]
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "calibration.md"

# script -> arguments that let one run go on past the measured steps (the runner stops it there)
SCRIPTS: dict[str, list[str]] = {  # the ones with warnings first: a run stopped by --max-minutes has them
    "slow_loader": ["--batch-size", "8", "--images", "48", "--steps", "100000"],
    "item_sync": ["--steps", "100000"],
    "conv_fp32": ["--batch-size", "16", "--size", "32", "--steps", "100000"],
    "mnist_style": ["--epochs", "50"],
    "nanogpt_style": ["--iters", "100000"],
    "imagenet_style": ["--dummy", "--epochs", "50"],
    "word_lm": ["--epochs", "50"],
    "healthy": ["--steps", "100000"],
}
# framework loops: a child run imports Lightning / transformers (seconds each); asked for by name only
OPTIONAL: dict[str, list[str]] = {
    "lightning_loop": ["--epochs", "1000"],
    "hf_trainer": ["--max-steps", "100000"],
}
# script -> (finding, arguments that run it with that finding's fix applied by hand): fixes `fix` cannot
# inject, timed against the script as it is in interleaved fresh runs (`profile.fresh_runs`)
HAND_FIXED: dict[str, tuple[str, list[str]]] = {"item_sync": ("sync.item", ["--fixed"])}
TOPS: dict[str, str] = {}  # script -> its first-ranked findings, for scripts without a row
POINT_WARN = 1.05  # an info row's point speed-up that would have been a warning without its interval
ISA_FLAGS = frozenset({"avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile"})
PROFILE_S = 45.0  # what a script's profile takes (probes; most scripts need no fresh-run timing), kept free for each


def wanted(f: Any, point: float | None, all_info: bool) -> bool:
    from pitstop.findings import Severity

    if f.severity.rank >= Severity.WARN.rank:
        return True
    return f.severity is Severity.INFO and (all_info or (point or 0.0) >= POINT_WARN)


def outcome(severity: str, verdict: str, after: str) -> str:
    if verdict == "helped":
        return "confirmed" if severity == "warn" else "helped (was info)"
    if after != severity:
        return "demoted"
    if verdict in ("no change", "hurt"):
        return "info, fix no faster" if severity == "info" else "demoted"
    return "open"


def profile(name: str, args: argparse.Namespace) -> tuple[Any, list[str], str | None]:
    from pitstop.profile.confirm.fresh_confirm import confirm_all
    from pitstop.profile.runs.runner import RunSpec, run

    cmd = [sys.executable, f"examples/{name}.py", *({**SCRIPTS, **OPTIONAL}[name])]
    spec = RunSpec(cmd, steps=args.profile_steps, warmup=args.warmup, timeout=600, cwd=str(ROOT), quiet=True)
    print(f"{name}: profile", file=sys.stderr, flush=True)
    prof = run(spec)
    if not prof.ok:
        return None, cmd, prof.error or prof.status
    confirm_all(spec, prof)  # the fresh-run timings `pitstop profile` makes of would-be warnings
    return prof.report(), cmd, None


def rows_for(
    name: str, args: argparse.Namespace, deadline: float, reserve_s: float = 0.0
) -> tuple[list[dict[str, Any]], str | None]:
    """The script's rows; a fix starts only when it ends ``reserve_s`` (the later profiles) before the
    deadline."""
    from pitstop.findings import Severity
    from pitstop.fix import verdict_cache
    from pitstop.fix.core import FINDING_KINDS
    from pitstop.fix.runs import run_fix as real_run_fix
    from pitstop.fix.verify import below_prediction, fix_config, predicted_speedup, verdict_finding
    from pitstop.profile.analyze.confirm import UNTIMED

    report, cmd, err = profile(name, args)
    if report is None:
        return [], err
    step_s = float((report.sections.get("breakdown") or {}).get("median_step_s") or 0.0)
    ranked = report.ranked()
    TOPS[name] = ", ".join(f"`{f.id}` {f.severity}" for f in ranked[:2]) or "no finding"
    rows = []
    for f in ranked:
        kind = FINDING_KINDS.get(f.id)
        hand = HAND_FIXED.get(name, ("", []))[0] == f.id
        untimed = f.id in UNTIMED and "no interval" in f.evidence
        if (kind is None and not hand and not untimed) or not f.est_saving_s:
            continue
        point, bounds = predicted_speedup(f, step_s)
        if not wanted(f, point, args.all_info):
            continue
        row: dict[str, Any] = {
            "script": name,
            "finding": f.id,
            "severity": str(f.severity),
            "predicted": point,
            "predicted_ci": bounds,
            "confirmed": f.data.get("confirmed"),
            "measured": None,
            "measured_ci": None,
            "measured_text": "",
            "verdict": "not measured",
            "after": str(f.severity),
        }
        rows.append(row)
        if untimed:  # profile demoted it: no run can time its fix
            row.update(
                measured_text="no injectable fix: " + UNTIMED[f.id], outcome="info: fix not injectable"
            )
            continue
        budget = args.budget if f.severity.rank >= Severity.WARN.rank else args.info_budget
        if budget <= 0:
            row["measured_text"] = "not measured: --info-budget 0 (this run measures warnings only)"
            continue
        if time.monotonic() + budget + reserve_s > deadline:
            row["measured_text"] = f"not measured: past --max-minutes {args.max_minutes:g}"
            continue
        if hand:
            by_hand(row, f, cmd, args, budget)
            continue
        print(f"{name}: fix --candidates {kind} ({f.id}, {f.severity})", file=sys.stderr, flush=True)
        cfg = fix_config(
            f,
            kind,
            budget,
            steps=args.steps,
            warmup=args.warmup,
            max_rounds=args.max_rounds,
            cwd=str(ROOT),
        )
        result = real_run_fix(cmd, cfg)
        m = next((c for c in result.candidates if c.kind == kind and not c.on_top_of), None)
        iv = m.interval if m else None
        row.update(
            measured=iv.estimate if iv else None,
            measured_ci=[iv.lo, iv.hi] if iv else None,
            measured_text=iv.text()
            if iv
            else (m.reason if m else "; ".join(result.skipped_candidates) or (result.baseline_error or "")),
            verdict=m.verdict if m else "not measured",
        )
        with tempfile.TemporaryDirectory(prefix="calib-verdicts-") as cache:  # as a later profile shows it
            verdict_cache.record(result, cache, cwd=str(ROOT))
            (later,) = verdict_cache.annotate(
                [f], verdict_cache.load(cache).get(verdict_cache.script_key(cmd, str(ROOT)) or "", {})
            )
        verdict = verdict_finding(f, kind, result, step_s)  # what `profile --verify` makes of it
        if verdict.data.get("below_prediction"):
            later = below_prediction(later, verdict)
        row["after"] = str(later.severity)
    for r in rows:
        b, v = r["predicted_ci"], r["measured"]
        r["inside"] = bool(b and v is not None and b[0] <= v <= b[1])
        r["below_one"] = bool(r["measured_ci"] and r["measured_ci"][1] < 1.0)
        r.setdefault("outcome", outcome(r["severity"], r["verdict"], r["after"]))
    return rows, None


def by_hand(row: dict[str, Any], f: Any, cmd: list[str], args: argparse.Namespace, budget: float) -> None:
    """``row`` measured: the script as it is vs the same script with ``HAND_FIXED``'s arguments, in
    interleaved fresh runs judged by ``pitstop.measure``; a fix that measured no change or hurt, or
    whose whole interval lies below the predicted one, leaves the finding info (as ``--verify`` would)."""
    from dataclasses import replace

    from pitstop.measure import HELPED, HURT, NO_CHANGE, Interval
    from pitstop.profile.confirm.fresh_runs import timed
    from pitstop.profile.runs.runner import RunSpec

    extra = HAND_FIXED[row["script"]][1]
    print(f"{row['script']}: {' '.join(extra)} by hand ({f.id}, {f.severity})", file=sys.stderr, flush=True)
    spec = RunSpec(cmd, timeout=budget, cwd=str(ROOT), quiet=True)
    two = timed(
        spec,
        lambda s: replace(s, command=[*s.command, *extra]),
        budget_s=budget,
        steps=args.steps or 30,
        rounds=args.max_rounds,
        min_rounds=3,  # decided as fix decides: from round 3, or at the last look
    )
    iv = Interval(**two["interval"]) if two.get("interval") else None
    verdict = two.get("verdict") or "not measured"
    bounds = row["predicted_ci"]
    below = bool(iv and bounds and verdict != HELPED and iv.hi < bounds[0])
    row.update(
        measured=iv.estimate if iv else None,
        measured_ci=[iv.lo, iv.hi] if iv else None,
        measured_text=(iv.text() if iv else "; ".join(two.get("errors") or ["no interval"]))
        + f" ({' '.join(extra)} by hand)",
        verdict=verdict,
        after="info" if verdict in (NO_CHANGE, HURT) or below else row["severity"],
    )


def above(r: dict[str, Any]) -> bool:
    """The measured speed-up lies above the whole predicted interval (the prediction undersold it)."""
    b, v = r["predicted_ci"], r["measured"]
    return bool(b and v is not None and v > b[1])


def fmt_pred(r: dict[str, Any]) -> str:
    if r["predicted"] is None:
        return "—"
    ci = r["predicted_ci"]
    text = f"{r['predicted']:.2f}x" + (f" (95% CI {ci[0]:.2f}–{ci[1]:.2f})" if ci else " (no interval)")
    return text + ("" if r["confirmed"] is None else (", confirmed" if r["confirmed"] else ", not confirmed"))


def main() -> int:
    from pitstop.host.load import OtherCpu, load_average

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scripts", default=",".join(SCRIPTS), help="comma list of examples/ scripts")
    ap.add_argument("--budget", type=float, default=75.0, help="seconds per fix measurement (one row)")
    ap.add_argument("--info-budget", type=float, default=40.0, help="seconds per info row's fix measurement")
    ap.add_argument(
        "--steps",
        type=int,
        default=None,
        help="measured steps per fix run (default: fix's choice from the start-up)",
    )
    ap.add_argument("--profile-steps", type=int, default=20, help="measured steps of the profile run")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--max-rounds", type=int, default=40, help="rounds at most (the budget ends them first)")
    ap.add_argument("--max-minutes", type=float, default=14.0, help="no fix starts past this")
    ap.add_argument("--all-info", action="store_true", help="also rows for info findings under 5%%")
    ap.add_argument("--out", type=Path, default=RESULTS, help="the results file (a smoke run: elsewhere)")
    args = ap.parse_args()
    names = [n for n in args.scripts.split(",") if n]
    unknown = [n for n in names if n not in SCRIPTS and n not in OPTIONAL]
    if unknown:
        ap.error(f"unknown script(s) {', '.join(unknown)}; choose from {', '.join([*SCRIPTS, *OPTIONAL])}")
    start, other, t0 = load_average(), OtherCpu(), time.perf_counter()
    deadline = time.monotonic() + 60 * args.max_minutes
    rows: list[dict[str, Any]] = []
    failed: dict[str, str] = {}
    for i, name in enumerate(names):
        got, err = rows_for(name, args, deadline, PROFILE_S * (len(names) - i - 1))
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
    from pitstop.host.cpu import cpu_flags, cpu_model, usable_cores
    from pitstop.host.load import load_line

    isa = sorted(cpu_flags() & ISA_FLAGS) or ["none of " + ", ".join(sorted(ISA_FLAGS))]

    lines = [
        "## Calibration: predicted saving vs measured speed-up (`benchmarks/calibration.py`"
        + (", warnings only)" if args.info_budget <= 0 else ")"),
        "",
        f"{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC, {cpu_model()} ({', '.join(isa)}), "
        f"{usable_cores()} usable cores; {load_line(start)}; "
        f"other processes used {other.share():.0%} of the CPUs over the {time.perf_counter() - t0:.0f} s run. "
        f"Scripts: {', '.join(names)}; profile {args.profile_steps} steps; fix budget {args.budget:.0f} s "
        f"per warning's row, {args.info_budget:.0f} s per info row, {args.steps or 'fix-chosen'} measured "
        f"steps per run (+{args.warmup} warm-up), at most "
        f"{args.max_rounds} rounds.",
        "",
        "| script | finding | severity | predicted speed-up | measured by fix | verdict | inside | < 1.0x "
        "| shown after the fix | outcome |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {r['script']} | `{r['finding']}` | {r['severity']} | {fmt_pred(r)} | {r['measured_text']} | "
            f"{r['verdict']} | {'yes' if r['inside'] else 'no'} | {'yes' if r['below_one'] else 'no'} | "
            f"{r['after']} | {r['outcome']} |"
        )
    quiet = [n for n in names if n not in failed and not any(r["script"] == n for r in rows)]
    for n in quiet:
        lines.append(
            f"| {n} | — (no finding with an injectable fix predicted >= 5%; first ranked: "
            f"{TOPS.get(n, '?')}) | | | | | | | | |"
        )
    warns = [r for r in rows if r["severity"] == "warn"]
    by = {k: sum(r["outcome"] == k for r in warns) for k in ("confirmed", "demoted", "open")}
    infos = [r for r in rows if r["severity"] != "warn"]
    kinds = sorted({r["outcome"] for r in infos})
    lines += [
        "",
        f"Warnings: {len(warns)}: confirmed {by['confirmed']}, demoted {by['demoted']}, open {by['open']}; "
        f"measured inside the predicted interval: {sum(r['inside'] for r in warns)}; "
        f"measured above it: {sum(above(r) for r in warns)}; "
        f"measured below 1.0x: {sum(r['below_one'] for r in warns)}. Info rows: {len(infos)} (predictions "
        "profile did not confirm, so it shows them as info, not as warnings; each one's fix measured here: "
        + (", ".join(f"{k} {sum(r['outcome'] == k for r in infos)}" for k in kinds) or "none")
        + "). An *open* info row is one whose fix stayed undecided within the budget: the product makes "
        "no claim on it.",
    ]
    for name, err in failed.items():
        lines.append(f"- {name}: the profile run failed: {err}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
