"""Does `pitstop fix` deliver what it promises? Its speed-up against the patched script's own timer.

For each built-in example (default: slow_loader, item_sync, conv_fp32, mnist_style), on a copy in a
temporary folder: `pitstop fix --apply --yes --json` measures the candidates and writes the fixes that
helped into the copy; then the original and the patched copy are run plain (no pitstop), alternating,
``--rounds`` times each, and each run's own timer (the examples print their throughput over the steps
after their warm-up; mnist_style does when ``EXAMPLE_STEP_TIMER`` is set) gives steps per wall-clock
second over the same steps. The realized speed-up is ``pitstop.measure.throughput.throughput_interval``
of those runs (a round: one run of each); it is set beside fix's promise (its throughput speed-up and
95% interval) with whether the realized figure lies inside the promised interval, the load the
machine was under (``pitstop.host.load``) and the CPU. Writes benchmarks/results/fix_promise.md.

    flock /tmp/pitstop-bench.lock .venv/bin/python benchmarks/fix_promise.py [--budget 60] [--rounds 3]
        [--examples slow_loader,item_sync] [--candidates workers] [--out benchmarks/results/fix_promise.md]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "fix_promise.md"
sys.path.insert(0, str(ROOT / "src"))

from pitstop.host.load import OtherCpu, load_average, load_line  # noqa: E402
from pitstop.host.machine import machine_line  # noqa: E402
from pitstop.measure import Interval  # noqa: E402
from pitstop.measure.throughput import Window, pooled, throughput_interval  # noqa: E402

# example -> its arguments (each run's timer covers the steps after the example's 5 warm-up steps)
EXAMPLES = {
    "slow_loader": ["--steps", "30"],
    "item_sync": ["--steps", "40"],
    "conv_fp32": ["--steps", "40"],
    "mnist_style": ["--samples", "1536"],
}
TIMER = re.compile(r"throughput: [\d.]+ samples/s over (\d+) steps \(([\d.]+) ms/step\)")
RUN_TIMEOUT_S = 300.0


@dataclass
class Outcome:
    name: str
    chosen: list[str] = field(default_factory=list)
    promised: Interval | None = None
    promised_point: float | None = None
    realized: Interval | None = None
    before: Window | None = None
    after: Window | None = None
    fix_s: float = 0.0
    note: str = ""
    candidates: list[str] = field(default_factory=list)  # "name: verdict" of each candidate fix measured


THREADS: str | None = None  # --threads: OMP_NUM_THREADS for every run, fix's and the plain ones alike


def env() -> dict[str, str]:
    """Every run: the patched copy may import pitstop (keep_host_memory); the timer on for mnist; the
    thread count when ``--threads`` sets one."""
    e = dict(os.environ)
    if THREADS:
        e["OMP_NUM_THREADS"] = THREADS
    e["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "src"), e.get("PYTHONPATH")) if p)
    e["EXAMPLE_STEP_TIMER"] = "5"
    return e


def run_fix(
    script: Path, args: list[str], budget: float, out: Path, candidates: str | None = None
) -> tuple[dict, float]:
    """`pitstop fix --apply --yes` on ``script`` (edited in place when a fix helped); its JSON section."""
    t = time.perf_counter()
    cmd = [sys.executable, "-m", "pitstop", "fix", "--quiet", "--budget", str(budget), "--apply", "--yes"]
    if candidates:
        cmd += ["--candidates", candidates]
    subprocess.run(
        [*cmd, "--json", str(out), "--", sys.executable, script.name, *args],
        cwd=script.parent,
        env=env(),
        check=False,
        capture_output=True,
        timeout=budget * 3 + 300,
    )
    wall = time.perf_counter() - t
    if not out.exists():
        return {}, wall
    return json.loads(out.read_text()).get("sections", {}).get("fix", {}), wall


def timed_run(script: Path, args: list[str]) -> Window | None:
    """One plain run of ``script``; its own timer's steps and seconds (None: it printed none)."""
    try:
        p = subprocess.run(
            [sys.executable, script.name, *args],
            cwd=script.parent,
            env=env(),
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        return None
    m = TIMER.search(p.stdout)
    if m is None:
        return None
    n, ms = int(m.group(1)), float(m.group(2))
    return Window(n, n * ms / 1000.0)


def realized(original: Path, patched: Path, args: list[str], rounds: int) -> tuple[list, list]:
    """Alternating plain runs, the order swapped every round: (original windows, patched windows)."""
    before: list[Window] = []
    after: list[Window] = []
    for r in range(rounds):
        order = [(original, before), (patched, after)]
        for script, into in order if r % 2 == 0 else order[::-1]:
            into.append(timed_run(script, args) or Window(0, 0.0))
    return before, after


def one(name: str, budget: float, rounds: int, tmp: Path, candidates: str | None = None) -> Outcome:
    out = Outcome(name)
    args = EXAMPLES[name]
    work = tmp / name
    work.mkdir()
    original = work / f"{name}_original.py"
    patched = work / f"{name}.py"
    shutil.copy(ROOT / "examples" / f"{name}.py", original)
    shutil.copy(original, patched)
    print(f"{name}: pitstop fix --budget {budget:.0f} --apply", file=sys.stderr, flush=True)
    fix, out.fix_s = run_fix(patched, args, budget, work / "fix.json", candidates)
    out.chosen = list(fix.get("chosen") or [])
    out.candidates = [
        f"{c['name']}{' (with ' + c['on_top_of'] + ')' if c.get('on_top_of') else ''}: {c.get('verdict')}"
        + (f" {c['interval_text']}" if c.get("interval_text") else "")
        + (
            f" ({c['reason'][:120]})"
            if c.get("verdict") in ("failed", "rejected") and c.get("reason")
            else ""
        )
        for c in fix.get("candidates") or []
    ]
    out.promised_point = fix.get("speedup")
    out.promised = Interval(**fix["interval"]) if fix.get("interval") else None
    if not out.chosen:
        out.note = "fix recommended nothing: nothing to realize" if fix else "fix gave no report"
        return out
    if patched.read_text() == original.read_text():
        out.note = "fix's change could not be written into the script (no diff)"
        return out
    print(f"{name}: {rounds} rounds of plain runs, original vs patched", file=sys.stderr, flush=True)
    before, after = realized(original, patched, args, rounds)
    out.realized = throughput_interval(before, after)
    out.before, out.after = pooled([w for w in before if w.rate]), pooled([w for w in after if w.rate])
    if out.realized is None:
        out.note = "the plain runs printed no timer line"
    return out


def cell(iv: Interval | None, point: float | None = None) -> str:
    if iv is not None:
        return iv.text()
    return f"{point:.2f}x (no interval)" if point else "-"


def inside(o: Outcome) -> str:
    if o.realized is None or o.promised is None:
        return "-"
    return "yes" if o.promised.lo <= o.realized.estimate <= o.promised.hi else "no"


def step_ms(w: Window | None) -> str:
    return f"{1000 * w.seconds / w.steps:.1f}" if w and w.steps else "-"


def report(
    outcomes: list[Outcome], fix_args: str, rounds: int, start: float | None, other: float, wall: float
) -> str:
    lines = [
        "# fix's promise against the patched script's own timer",
        "",
        f"- machine: {machine_line()}",
        f"- date: {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC",
        f"- per example: `pitstop fix {fix_args} --apply --yes` on a copy, then the original and "
        f"the patched copy run plain, alternating, {rounds} rounds; realized = throughput (steps per "
        "wall-clock second over the steps the script's own timer covers) of the patched over the original, "
        "95% interval over the rounds (`pitstop.measure.throughput`)",
        f"- {load_line(start)}; other processes used {other:.0%} of the CPUs during the runs; "
        f"the whole benchmark took {wall / 60:.1f} min",
        f"- threads: OMP_NUM_THREADS={THREADS} for every run, fix's and the plain ones"
        if THREADS
        else "- threads: torch's default in every run",
        "- run by `flock /tmp/pitstop-bench.lock .venv/bin/python benchmarks/fix_promise.py`",
        "",
        "| example | fix recommends | promised (fix) | realized (script's timer) | inside | ms/step before -> after "
        "| fix's wall time | candidates measured |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for o in outcomes:
        realized_text = cell(o.realized) if o.realized else (o.note or "-")
        lines.append(
            f"| {o.name} | {' + '.join(o.chosen) or 'nothing'} | {cell(o.promised, o.promised_point)} | "
            f"{realized_text} | {inside(o)} | {step_ms(o.before)} -> {step_ms(o.after)} | {o.fix_s:.0f} s | "
            f"{'; '.join(o.candidates) or 'none'} |"
        )
    judged = [o for o in outcomes if o.realized is not None and o.promised is not None]
    held = sum(inside(o) == "yes" for o in judged)
    lines += [
        "",
        f"Realized inside the promised interval: {held} of {len(judged)} examples with both figures.",
    ]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=float, default=60.0, help="fix's --budget per example (s)")
    ap.add_argument("--rounds", type=int, default=3, help="plain runs of each side per example")
    ap.add_argument("--examples", default=",".join(EXAMPLES), help="comma list of " + ", ".join(EXAMPLES))
    ap.add_argument("--candidates", default=None, help="fix's --candidates (default: from its profile)")
    ap.add_argument("--threads", default=None, help="OMP_NUM_THREADS for every run (fix's and plain)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    global THREADS
    THREADS = args.threads
    names = [n.strip() for n in args.examples.split(",") if n.strip()]
    unknown = [n for n in names if n not in EXAMPLES]
    if unknown:
        ap.error(f"unknown example(s) {', '.join(unknown)}; choose from {', '.join(EXAMPLES)}")
    start, other, t0 = load_average(), OtherCpu(), time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="pitstop-fix-promise-") as tmp:
        outcomes = [one(n, args.budget, args.rounds, Path(tmp), args.candidates) for n in names]
    fix_args = f"--budget {args.budget:.0f}" + (f" --candidates {args.candidates}" if args.candidates else "")
    text = report(outcomes, fix_args, args.rounds, start, other.share(), time.perf_counter() - t0)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
