"""Instrumentation overhead of `pitstop profile`: each example run plain and under the profiler.

Both runs time themselves the same way: every example prints its own ms/step over the steps after its
warm-up. Two measurements, each alternating plain and instrumented runs:

1. end to end: `python examples/X.py` vs `pitstop profile --full --no-probes -- python examples/X.py`
   (every hook installed for the whole run, stopping disabled so the script's own timing covers the same
   steps), each in a fresh process;
2. in one process: the example run with runpy, alternately bare and with the same instrumentation the
   profiler's child installs (periodic flush included). Process start-up and placement noise cancel out,
   so this is the sharper number on a busy machine.

Tables give min and median over the repeats and the overhead of the medians. The requirement is < 5% of
step time.

    flock /tmp/pitstop-bench.lock .venv/bin/python benchmarks/profile_overhead.py [--repeats 2] [--inproc-repeats 8]
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "profile_overhead.md"
RATE = re.compile(r"\(([\d.]+) ms/step\)")
HEADER = (
    "| example | plain min ms/step | plain median | profiled min | profiled median | overhead (medians) "
    "| overhead (median of paired ratios) |"
)

# example, its arguments: enough steps that the script's own timing covers a few seconds
WORKLOADS = {
    "healthy.py": ["--steps", "60"],
    "item_sync.py": ["--steps", "80"],
    "conv_fp32.py": ["--steps", "30"],
    "slow_loader.py": ["--steps", "20", "--images", "64"],
}


def _table(rows: list) -> list[str]:
    """The markdown table under HEADER: one row per (example, four ms/step figures, two overheads in %)."""
    return [
        HEADER,
        "| --- | --- | --- | --- | --- | --- | --- |",
        *(
            f"| {n} | {a:.2f} | {b:.2f} | {c:.2f} | {d:.2f} | {o:+.1f}% | {q:+.1f}% |"
            for n, a, b, c, d, o, q in rows
        ),
    ]


def plain(script: Path, args: list[str], env: dict[str, str]) -> float:
    out = subprocess.run(
        [sys.executable, str(script), *args], capture_output=True, text=True, env=env, check=True, cwd=ROOT
    ).stdout
    return _ms(out)


def instrumented(script: Path, args: list[str], env: dict[str, str]) -> float:
    from pitstop.profile.runs.runner import RunSpec, run

    with tempfile.TemporaryDirectory() as tmp:
        spec = RunSpec(
            command=[sys.executable, str(script), *args],
            full=True,
            probes=False,
            quiet=True,
            env=env,
            cwd=str(ROOT),
        )
        result = run(spec, out_dir=Path(tmp))
        if not result.ok:
            raise RuntimeError(f"{script.name} failed under the profiler: {result.error}")
        return _ms((Path(tmp) / "stdout.txt").read_text())


def in_process(script: Path, args: list[str], instrumented_run: bool, tmp: Path) -> float:
    import contextlib
    import io
    import runpy

    from pitstop.profile.capture.hooks import Config, Instrumentation

    argv = sys.argv
    sys.argv = [str(script), *args]
    inst = None
    if instrumented_run:
        inst = Instrumentation(Config(full=True, warmup=5, out_dir=tmp, probes=False))
        inst.flush_path = tmp / "measurements.json"
        inst.install()
    buf = io.StringIO()
    try:
        with contextlib.redirect_stdout(buf):
            runpy.run_path(str(script), run_name="__main__")
    finally:
        if inst is not None:
            inst.uninstall()
        sys.argv = argv
    return _ms(buf.getvalue())


def _ms(stdout: str) -> float:
    m = RATE.search(stdout)
    if not m:
        raise RuntimeError(f"no 'ms/step' line in the script's output:\n{stdout[-500:]}")
    return float(m.group(1))


def _row(name: str, times: dict[str, list[float]]) -> tuple[str, float, float, float, float, float, float]:
    """min/median of each, overhead of the medians, and the median of the per-repeat ratios (each repeat
    ran plain and profiled back to back, so machine load drifting between repeats cancels out)."""
    p_med, i_med = statistics.median(times["plain"]), statistics.median(times["profiled"])
    paired = statistics.median(i / p for p, i in zip(times["plain"], times["profiled"], strict=True))
    return (
        name,
        min(times["plain"]),
        p_med,
        min(times["profiled"]),
        i_med,
        100.0 * (i_med / p_med - 1.0),
        100.0 * (paired - 1.0),
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=2, help="end-to-end repeats per example")
    ap.add_argument("--inproc-repeats", type=int, default=8, help="in-process repeats per example")
    ap.add_argument("--threads", type=int, default=1, help="OMP threads for every run (default 1)")
    ap.add_argument("--only", nargs="*", help="example file names to run (default: all)")
    ap.add_argument(
        "--results", type=Path, default=RESULTS, help=f"where to write the table (default {RESULTS})"
    )
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT / "src"))
    from pitstop.host.load import load_average, load_line
    from pitstop.host.machine import machine_line

    args.load0 = load_average()
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads)}
    names = args.only or list(WORKLOADS)
    rows = []
    for name in names:
        script = ROOT / "examples" / name
        extra = WORKLOADS[name]
        times: dict[str, list[float]] = {"plain": [], "profiled": []}
        for r in range(args.repeats):
            order = ("plain", "profiled") if r % 2 == 0 else ("profiled", "plain")
            for kind in order:
                ms = (plain if kind == "plain" else instrumented)(script, extra, env)
                times[kind].append(ms)
                print(f"{name:16s} {kind:9s} repeat {r + 1}: {ms:8.2f} ms/step", flush=True)
        rows.append(_row(name, times))
    import torch

    torch.set_num_threads(args.threads)
    inproc_rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            script = ROOT / "examples" / name
            times = {"plain": [], "profiled": []}
            in_process(script, WORKLOADS[name], True, Path(tmp))  # warm imports and caches once
            for r in range(args.inproc_repeats):
                order = (False, True) if r % 2 == 0 else (True, False)
                for instr in order:
                    ms = in_process(script, WORKLOADS[name], instr, Path(tmp))
                    times["profiled" if instr else "plain"].append(ms)
                    kind = "profiled" if instr else "plain"
                    print(f"{name:16s} in-process {kind:9s} repeat {r + 1}: {ms:8.2f} ms/step", flush=True)
            inproc_rows.append(_row(name, times))

    command = "flock /tmp/pitstop-bench.lock .venv/bin/python benchmarks/profile_overhead.py"
    if sys.argv[1:]:
        command += " " + shlex.join(sys.argv[1:])
    lines = [
        "# profile: instrumentation overhead on the built-in examples",
        "",
        f"- machine: {machine_line()}",
        f"- date: {dt.datetime.now(dt.UTC).isoformat(timespec='seconds')}",
        f"- command: `{command}`",
        f"- method: each example prints its own ms/step after its warm-up; plain `python examples/X.py` vs "
        f"`pitstop profile --full --no-probes -- python examples/X.py` (all hooks on for the whole run), "
        f"fresh process each, alternating order, {args.repeats} repeats; then the same in one process; "
        f"OMP_NUM_THREADS={args.threads}",
        f"- {load_line(args.load0)}: differences of a few percent either way are within run-to-run noise; "
        "the requirement is < 5% overhead",
        "",
        "End to end (fresh process per run):",
        "",
        *_table(rows),
        "",
        f"In one process (runpy, bare vs instrumented alternating, {args.inproc_repeats} repeats each):",
        "",
        *_table(inproc_rows),
    ]
    text = "\n".join(lines) + "\n"
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(text)
    print()
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
