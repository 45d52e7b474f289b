"""What torch's default intra-op threads cost when other work takes the cores, and what pitstop's thread
probe says about it.

Runs examples/slow_loader.py plain (no pitstop) with torch's default threads vs OMP_NUM_THREADS=1,
interleaved in rounds through ``pitstop.measure`` (each run's throughput: its own timer's ms/step over
its measured steps), first on the machine as it is ("no burner": whatever else runs there, quoted),
then with one busy process per usable core ("burner"). Prints each condition's speed-up of 1 thread over the default with
its 95% interval, and what the script competed with (``host.load.CompetitionMeter`` over the runs) and
the load it ran under (``host.load.load_line``). Then, under the burner, the thread probe itself
(``pitstop.profile.probe.thread_probe``) on a small conv net: the threads it fits and its A/B. Writes
benchmarks/results/contention_threads.md. About 3-5 minutes on 2 cores.

    .venv/bin/python benchmarks/contention_threads.py [--rounds 3] [--steps 6] [--budget 90]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "contention_threads.md"
sys.path.insert(0, str(ROOT / "src"))

from pitstop.host.cpu import usable_cores  # noqa: E402
from pitstop.host.load import CompetitionMeter, load_average, load_line  # noqa: E402
from pitstop.host.machine import machine_line  # noqa: E402
from pitstop.measure import Arm, Settings, interleave  # noqa: E402

MS_PER_STEP = re.compile(r"\(([\d.]+) ms/step\)")
# busy until its parent is gone: a burner never outlives the benchmark, however that ends
BURN = "import os\nparent = os.getppid()\nwhile os.getppid() == parent: pass"
RUN_TIMEOUT_S = 300


@contextlib.contextmanager
def burners(n: int) -> Iterator[None]:
    """``n`` busy processes in sessions of their own (other work, not the script's); killed on exit."""
    procs = [subprocess.Popen([sys.executable, "-c", BURN], start_new_session=True) for _ in range(n)]
    try:
        yield
    finally:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGKILL)
            p.wait()


def run_example(threads: int | None, steps: int, warmup: int) -> list[float] | None:
    """One plain run of slow_loader.py: its own timer's seconds per step (None where it failed)."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    try:
        out = subprocess.run(
            [sys.executable, "examples/slow_loader.py", "--steps", str(steps), "--warmup", str(warmup)],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            check=False,
            timeout=RUN_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        return None
    m = MS_PER_STEP.search(out.stdout)
    return [float(m.group(1)) / 1000] if m else None


def condition(name: str, rounds: int, steps: int, warmup: int, budget_s: float) -> dict[str, object]:
    """Default threads vs 1, interleaved for up to ``rounds`` rounds (at least 2, more while they fit
    ``budget_s``); the interval and what the runs competed with."""
    meter, load0 = CompetitionMeter(), load_average()
    base, one = Arm("default threads"), Arm("1 thread")

    def sample(arm: str) -> list[float] | None:
        meter.sample()
        got = run_example(None if arm == base.name else 1, steps, warmup)
        print(
            f"  {name}: {arm}: {got[0] * 1000:.0f} ms/step" if got else f"  {name}: {arm}: failed", flush=True
        )
        return got

    # at least two rounds (an interval), more while they fit the budget
    interleave(base, [one], sample, Settings(budget_s=budget_s, min_rounds=rounds + 1, max_rounds=rounds))
    if len(base.rounds) < 2:
        one.verdict = None  # undecided after one round: open again for the second
        interleave(base, [one], sample, Settings.every_round(2))
    med = [sorted(v for r in a.rounds for v in r) for a in (base, one)]
    return {
        "name": name,
        "default_ms": [round(1000 * v, 1) for v in med[0]],
        "one_ms": [round(1000 * v, 1) for v in med[1]],
        "interval": one.interval.text() if one.interval else "no interval",
        "competition": meter.result().text(),
        "load": load_line(load0),
    }


def probe_under_burner() -> str:
    """The thread probe on a small conv net, under the burner: what it fitted and measured."""
    import torch
    from torch import nn

    from pitstop.profile.probe import thread_probe

    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1))
    rec = thread_probe.run(model, ((torch.randn(16, 3, 64, 64),), {}), {})["threads"]
    if "base_s" not in rec:
        return f"{rec['threads']} threads, {rec['fit']} fit: no A/B ({rec.get('skipped', 'threads fit')})"
    return (
        f"{rec['threads']} threads vs {rec['fit']}: forward+backward {1000 * rec['base_s']:.1f} ms vs "
        f"{1000 * rec['new_s']:.1f} ms, {rec.get('interval_text', 'no interval')}"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--budget", type=float, default=90.0, help="seconds of rounds per condition")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--burners", type=int, default=0, help="busy processes (default: one per usable core)")
    args = ap.parse_args()
    n_burn = args.burners or usable_cores()
    t0 = time.perf_counter()
    rows = [condition("no burner", args.rounds, args.steps, args.warmup, args.budget)]
    with burners(n_burn):
        time.sleep(0.5)  # the burners are running before the first round
        rows.append(condition("burner", args.rounds, args.steps, args.warmup, args.budget))
        probe = probe_under_burner()
    wall = time.perf_counter() - t0
    cmd = " ".join(["benchmarks/contention_threads.py", *sys.argv[1:]])
    lines = [
        "# Contention: torch's default threads vs 1 thread while other work takes the cores",
        "",
        f"- machine: {machine_line()}",
        f"- date: {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC",
        f"- command: `python examples/slow_loader.py --steps {args.steps} --warmup {args.warmup}` plain, "
        f"OMP_NUM_THREADS unset vs 1, interleaved rounds (2 to {args.rounds}, within {args.budget:.0f} s a condition); burner: {n_burn} busy "
        f"process(es) (a busy loop); run by `.venv/bin/python {cmd}`; {wall:.0f} s in all",
        "- speed-up: 1 thread over the default, each run's throughput (its own timer over its measured steps), "
        "rounds paired by `pitstop.measure`; competed with: `host.load.CompetitionMeter` over the condition, "
        "seen from the benchmark (its runs' CPU time is its own; their threads count in the run queue)",
        "",
        "| condition | default threads, ms/step | 1 thread, ms/step | speed-up of 1 thread | competed with | load |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {r['name']} | {', '.join(map(str, r['default_ms']))} | {', '.join(map(str, r['one_ms']))} | "
            f"{r['interval']} | {r['competition']} | {r['load']} |"
        )
    lines += [
        "",
        f"Thread probe (pitstop.profile.probe.thread_probe) under the burner, a small conv net: {probe}.",
        "",
    ]
    text = "\n".join(lines)
    print(text)
    RESULTS.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
