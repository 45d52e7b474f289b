"""`pitstop fix` run twice in a row on one example: is every candidate decided, and the same both times?

Runs `pitstop fix --json` on the example (default: examples/mnist_style.py --epochs 1, a small CNN with
Adadelta and num_workers=0, the shape of pytorch/examples' MNIST) twice, back to back, with fix's
default settings, and writes each candidate's verdict and 95% interval per run, the wall time of each
run, and whether the two runs agree. Writes benchmarks/results/fix_twice.md.

    flock /tmp/pitstop-bench.lock .venv/bin/python benchmarks/fix_twice.py [--runs 2] [-- python examples/X.py ARGS]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "fix_twice.md"
sys.path.insert(0, str(ROOT / "src"))

from pitstop.host.load import OtherCpu, load_average, load_line  # noqa: E402
from pitstop.host.machine import machine_line  # noqa: E402

DEFAULT = ["python", "examples/mnist_style.py", "--epochs", "1"]


def one_run(cmd: list[str], out: Path) -> tuple[dict[str, dict[str, str]], float]:
    """{candidate name: {verdict, interval}} of one `pitstop fix` run, and its wall time."""
    t = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "pitstop", "fix", "--quiet", "--json", str(out), "--", *cmd],
        cwd=ROOT,
        check=False,
        capture_output=True,
    )
    wall = time.perf_counter() - t
    fix = json.loads(out.read_text())["sections"]["fix"]
    found = {}
    for c in fix.get("candidates") or []:
        if c.get("on_top_of"):
            continue
        found[c["name"]] = {"verdict": c.get("verdict", "?"), "interval": c.get("interval_text") or "-"}
    return found, wall


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("cmd", nargs=argparse.REMAINDER, help="-- python examples/X.py ARGS")
    args = ap.parse_args()
    cmd = [a for a in args.cmd if a != "--"] or DEFAULT
    cmd = [sys.executable if c == "python" else c for c in cmd]
    start, other = load_average(), OtherCpu()
    runs = []
    with tempfile.TemporaryDirectory(prefix="pitstop-fix-twice-") as tmp:
        for i in range(args.runs):
            print(f"run {i + 1}/{args.runs}: pitstop fix -- {' '.join(cmd)}", file=sys.stderr, flush=True)
            runs.append(one_run(cmd, Path(tmp) / f"run{i}.json"))
    names = sorted({n for found, _ in runs for n in found})
    same = all(len({found.get(n, {}).get("verdict") for found, _ in runs}) == 1 for n in names)
    decided = all(
        found.get(n, {}).get("verdict") not in (None, "undecided") for found, _ in runs for n in names
    )
    shown = " ".join(["python" if c == sys.executable else c for c in cmd])
    lines = [
        "# fix, run twice: decided verdicts, and the same ones",
        "",
        f"- machine: {machine_line()}",
        f"- date: {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC",
        f"- command: `pitstop fix --json F -- {shown}` (fix's defaults: budget 300 s), {args.runs} runs back to back, "
        "run by `flock /tmp/pitstop-bench.lock .venv/bin/python benchmarks/fix_twice.py`",
        f"- {load_line(start)}; other processes used {other.share():.0%} of the CPUs during the runs",
        "",
        "| candidate | " + " | ".join(f"run {i + 1}" for i in range(len(runs))) + " | same verdict |",
        "| --- | " + " | ".join("---" for _ in runs) + " | --- |",
    ]
    for n in names:
        cells = [f"{f[n]['verdict']}: {f[n]['interval']}" if n in f else "not a candidate" for f, _ in runs]
        agree = len({f.get(n, {}).get("verdict") for f, _ in runs}) == 1
        lines.append(f"| {n} | " + " | ".join(cells) + f" | {'yes' if agree else 'no'} |")
    lines.append("| wall time | " + " | ".join(f"{w:.0f} s" for _, w in runs) + " | |")
    lines += [
        "",
        f"Every candidate decided in every run: {'yes' if decided else 'no'}; the same verdict in every run: "
        f"{'yes' if same else 'no'}; slowest run {max(w for _, w in runs):.0f} s (target: 360 s).",
    ]
    text = "\n".join(lines) + "\n"
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
