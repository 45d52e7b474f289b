"""`pitstop bench --workload vision --size small`, timed end to end, written to
benchmarks/results/bench_vision_small.md.

The bench itself interleaves its configs (baseline, workers, channels_last, AMP bf16, fused AdamW,
activation checkpointing, accumulation, all together, Lightning, Accelerate), times torch.compile in a
held subprocess against its own interleaved baseline, runs DDP 1 vs 2 processes (gloo) and OneCycle vs
StepLR, and measures the torch.mm peak in the same run. This script runs the CLI as a user would, checks
that it finished inside the budget, and records the table.

    flock /tmp/pitstop-bench.lock .venv/bin/python benchmarks/bench_vision_small.py [-- extra pitstop bench args]
"""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "bench_vision_small.md"
BUDGET_S = 300


def main(argv: list[str]) -> int:
    extra = argv[1:] if argv[:1] == ["--"] else argv
    with tempfile.TemporaryDirectory(prefix="pitstop-bench-vs-") as tmp:
        out_json, out_md = Path(tmp) / "bench.json", Path(tmp) / "bench.md"
        cmd = [sys.executable, "-m", "pitstop", "bench", "--workload", "vision", "--size", "small",
               "--budget", f"{BUDGET_S}s", "--json", str(out_json), "--markdown", str(out_md), "-q", *extra]  # fmt: skip
        t0 = time.monotonic()
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        wall = time.monotonic() - t0
        if proc.returncode != 0 or not out_json.exists():
            print(proc.stderr[-3000:], file=sys.stderr)
            print(f"pitstop bench failed with exit code {proc.returncode}", file=sys.stderr)
            return 1
        report = json.loads(out_json.read_text())
        table = out_md.read_text()

    from pitstop.host.machine import machine_line

    bench = report["sections"]["bench"]
    meta = report["meta"]
    shown = "pitstop bench --workload vision --size small" + (" " + " ".join(extra) if extra else "")
    lines = [
        "# pitstop bench: vision/small ablation",
        "",
        f"- machine: {machine_line()}",
        f"- date: {dt.datetime.now(dt.UTC).strftime('%Y-%m-%d %H:%M UTC')}",
        f"- command: `{shown}` (default budget 5m), run by "
        "`flock /tmp/pitstop-bench.lock .venv/bin/python benchmarks/bench_vision_small.py`",
        f"- workload: {meta['workload']}; {meta['threads']} torch threads; {meta['steps_per_block']} steps per "
        f"block, {meta['repeats']} interleaved repeats",
        f"- wall time of the whole command: {wall:.0f} s (budget {BUDGET_S} s; "
        f"{'inside' if wall <= BUDGET_S else 'OVER'} the budget); phases: "
        + ", ".join(f"{k} {v:.0f} s" for k, v in bench["phases_s"].items()),
        f"- load average (1 min) at start / end: {meta['load_avg'].get('start', 'unknown')} / "
        f"{meta['load_avg'].get('end', 'unknown')} on {meta['machine']['usable_cores']} usable cores; other "
        f"processes used {meta.get('other_cpu_share', 0.0):.0%} of the machine's CPU time during the run "
        "(pitstop.host.load.OtherCpu); ratios come from configurations interleaved in the same run, so "
        "background load spreads over all rows.",
        "",
        table.strip(),
        "",
    ]
    for note in bench.get("notes") or []:
        lines.append(f"Note: {note}")
    lines += [
        "",
        "Ratios are against the baseline timed in the same process (compile rows: against the baseline the "
        "compile worker timed interleaved with them; DDP 2 processes: against DDP with 1 process at the same "
        "threads per process). 'activations' is the memory a forward pass leaves live for backward; 'peak' is "
        "the most memory live during one step above what was live before it (profiler allocation events).",
    ]
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"wrote {RESULTS}")
    return 0 if wall <= BUDGET_S else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
