"""Time to an answer: `pitstop profile` on default settings vs the script's own time for the same steps.

For each example that runs standalone on CPU: (a) the script run plain with arguments that make it take
about the steps pitstop measures (5 warm-up + 30 measured), start-up included, and (b) `pitstop profile
--json R -- python examples/X.py` with the same arguments on default settings, wall time end to end,
and its stages from the report's ``meta.timings`` (start-up, measured window, probes, each fresh
confirmation's seconds). The target (issue 35): profile <= plain + 60 s. Alternating order per repeat.

    flock -x /tmp/pitstop-bench.lock .venv/bin/python benchmarks/profile_answer_time.py [--only X.py ...]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "profile_answer_time.md"
TARGET_S = 60.0

# example: arguments that make the plain script run about 35 optimizer steps (pitstop's 5 + 30)
WORKLOADS: dict[str, list[str]] = {
    "healthy.py": ["--steps", "30", "--warmup", "5"],
    "item_sync.py": ["--steps", "30", "--warmup", "5"],
    "conv_fp32.py": ["--steps", "30", "--warmup", "5"],
    "slow_loader.py": ["--steps", "30", "--warmup", "5", "--images", "64"],
    "direct_forward.py": ["--steps", "35"],
    "float64_model.py": ["--steps", "35"],
    "gan_two_optimizers.py": ["--steps", "35"],
    "lbfgs_closure.py": ["--steps", "35"],
    "nanogpt_style.py": ["--iters", "35"],
    "notebook_style.py": ["--steps", "35"],
    "mnist_style.py": ["--samples", "2240"],  # 35 batches of 64, then its test pass
    "word_lm.py": ["--epochs", "3"],  # 12 batches an epoch
    "accelerate_loop.py": ["--epochs", "3"],  # 16 batches an epoch
    "hf_trainer.py": ["--max-steps", "35"],
    "lightning_loop.py": ["--epochs", "1", "--records", "560"],  # 35 batches of 16
    "imagenet_style.py": ["--dummy", "--train-images", "280"],  # 35 batches of 8
    "resnet_slow_steps.py": ["--steps", "35"],
}
SKIPPED = {
    "ddp_accum.py": "needs torchrun (profile_ranks_overhead.py times the ranks)",
    "spawn_ddp.py": "trains in torch.multiprocessing children (profile_children_startup.py times them)",
    "hogwild.py": "trains in torch.multiprocessing children (profile_children_startup.py times them)",
}


def plain(name: str, env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(
        [sys.executable, f"examples/{name}", *WORKLOADS[name]], cwd=ROOT, env=env, capture_output=True, check=True
    )
    return time.perf_counter() - t0


def profiled(name: str, env: dict[str, str], extra: list[str]) -> tuple[float, dict]:
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "r.json"
        cmd = [sys.executable, "-m", "pitstop", "profile", "--json", str(report), *extra, "--"]
        t0 = time.perf_counter()
        subprocess.run(
            [*cmd, sys.executable, f"examples/{name}", *WORKLOADS[name]],
            cwd=ROOT,
            env=env,
            capture_output=True,
        )
        wall = time.perf_counter() - t0
        meta = json.loads(report.read_text()).get("meta", {}) if report.exists() else {}
    return wall, meta


def stages_text(meta: dict) -> str:
    t = meta.get("timings") or {}
    if not t:
        return "(not recorded)"
    parts = [f"start-up {t.get('startup_s', 0):.1f}", f"window {t.get('window_s', 0):.1f}"]
    parts.append(f"probes {t.get('probes_s', 0):.1f}")
    for name, s in (t.get("confirm_spent_s") or {}).items():
        parts.append(f"{name} {s:.1f}")
    return ", ".join(parts)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="*", help="example file names (default: all in WORKLOADS)")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1, help="OMP threads for every run (default 1)")
    ap.add_argument("--profile-args", default="", help="extra pitstop profile options, e.g. '--budget 30'")
    ap.add_argument("--results", type=Path, default=RESULTS)
    ap.add_argument("--label", default="", help="a line under the title, e.g. 'before the budget'")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT / "src"))
    from pitstop.host.load import load_average, load_line
    from pitstop.host.machine import machine_line

    load0 = load_average()
    src = str(ROOT / "src")
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads)}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    extra = shlex.split(args.profile_args)
    rows = []
    for name in args.only or list(WORKLOADS):
        for r in range(args.repeats):
            order = ("plain", "profile") if r % 2 == 0 else ("profile", "plain")
            got: dict = {}
            for kind in order:
                got[kind] = plain(name, env) if kind == "plain" else profiled(name, env, extra)
            wall, meta = got["profile"]
            over = wall - got["plain"] - TARGET_S
            row = (name, got["plain"], wall, over, meta.get("measured_steps"), stages_text(meta))
            rows.append(row)
            print(f"{name:22s} plain {row[1]:6.1f} s  profile {wall:6.1f} s  over-by {over:+6.1f} s  {row[5]}", flush=True)
    command = "flock -x /tmp/pitstop-bench.lock .venv/bin/python benchmarks/profile_answer_time.py"
    if sys.argv[1:]:
        command += " " + shlex.join(sys.argv[1:])
    lines = [
        "# profile: time to an answer on the examples",
        "",
        *([f"{args.label}", ""] if args.label else []),
        f"- machine: {machine_line()}",
        f"- date: {dt.datetime.now(dt.UTC).isoformat(timespec='seconds')}",
        f"- command: `{command}`",
        "- method: plain `python examples/X.py ARGS` (ARGS: about 35 optimizer steps, pitstop's 5 warm-up + 30 "
        "measured) vs `pitstop profile --json R -- python examples/X.py ARGS` on default settings, end to end, "
        f"fresh processes, OMP_NUM_THREADS={args.threads}; target: profile <= plain + {TARGET_S:.0f} s, "
        "so over-by = profile - plain - 60 s must be <= 0; stages from the report's meta.timings (s)",
        f"- {load_line(load0)}",
        "- skipped: " + "; ".join(f"{k}: {v}" for k, v in SKIPPED.items()),
        "",
        "| example | plain (s) | profile (s) | over-by (s) | measured steps | stages (s) |",
        "| --- | --- | --- | --- | --- | --- |",
        *(f"| {n} | {p:.1f} | {w:.1f} | {o:+.1f} | {m} | {s} |" for n, p, w, o, m, s in rows),
    ]
    text = "\n".join(lines) + "\n"
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(text)
    print()
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
