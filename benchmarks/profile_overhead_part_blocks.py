"""Which part of pitstop's instruments an example's in-process cost comes from: on/off blocks of steps in
one process (``profile_overhead_parts.toggled_blocks``), one part switched at a time, each part's run
repeated in fresh processes.

``profile_overhead_layers.py`` compares fresh processes, which on a shared VM differ by more than the
instruments cost. Here the instruments go on and off between blocks of steps of one run, so the two arms
share the process's memory layout and the machine's drift; what is switched is one of:

  none      nothing (on and off blocks alike: the blocks' own A/A floor)
  all       ``Instrumentation.install()``, as ``pitstop profile`` installs it
  loader, syncs, models, torch, to, backward, optinit, opthooks
            one part of ``install()`` alone, installed by the same code as
            ``profile_overhead_layers.py``'s layer of that name

Off is always ``Instrumentation.uninstall()``. Each part runs ``--passes`` times, each pass a fresh
process pinned to one core (OMP_NUM_THREADS=1), the parts' order rotated every pass. A pass gives one
share (the mean over its pairs of on / off - 1). Two intervals are reported: over the passes (a pass is
the unit: slow drift inside a run, which makes neighbouring pairs alike, stays inside one value) and over
all pairs pooled (narrower, and too narrow where pairs are not independent: compare the ``none`` row).

    flock -x /tmp/pitstop-bench.lock .venv/bin/python benchmarks/profile_overhead_part_blocks.py \
        [--example slow_loader.py] [--parts none all loader syncs models torch] [--pairs 24] [--passes 3]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

RESULTS = ROOT / "benchmarks" / "results" / "profile_overhead_part_blocks.md"
BLOCK, LEAD = 8, 24  # steps a block; steps with everything on first (pitstop's warm-up, hooks' narrowing)
# the examples' arguments for a long run; slow_loader's 64 images make 4 steps an epoch
ARGS = {"slow_loader.py": ["--images", "64", "--epochs", "100000"]}
SPECIAL = ("none", "all")


def installer(part: str) -> Any:
    """``install(inst)`` for ``part``: nothing, all of ``install()``, or one of its parts."""
    from pitstop.profile.capture.hooks import Instrumentation

    if part == "none":
        return lambda inst: None
    if part == "all":
        return Instrumentation.install
    from profile_overhead_layers import PARTS

    code = PARTS[part]
    return lambda inst: exec(code, {"inst": inst})  # the layers benchmark's own lines


def worker(example: str, part: str, pairs: int) -> None:
    """One pass: the example in this process, ``part`` toggled; prints the pairs' on/off means (JSON)."""
    from profile_overhead_parts import toggled_blocks

    steps = 5 + LEAD + (2 * pairs + 1) * BLOCK  # the script's warm-up, and a block to spare
    args = ["--steps", str(steps), *ARGS.get(example, [])]
    with tempfile.TemporaryDirectory() as tmp:
        cost = toggled_blocks(
            ROOT / "examples" / example,
            args,
            example,
            BLOCK,
            pairs,
            Path(tmp),
            lead=LEAD,
            install=installer(part),
        )
    print(json.dumps({"part": part, "on": cost.on, "off": cost.off, "spikes": cost.spikes}))


def one_pass(example: str, part: str, pairs: int, core: int) -> dict[str, Any]:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT / "src"))
    cmd = ["taskset", "-c", str(core), sys.executable, __file__, "--worker", example, part, str(pairs)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def shares(p: dict[str, Any]) -> list[float]:
    return [a / b - 1 for a, b in zip(p["on"], p["off"], strict=False) if b > 0]


def row(part: str, passes: list[dict[str, Any]]) -> str:
    import statistics

    from profile_overhead_parts import mean_interval

    each = [xs for xs in map(shares, passes) if xs]  # each pass's pairs' shares, computed once
    per_pass = [statistics.fmean(xs) for xs in each]
    pooled = [x for xs in each for x in xs]
    m, lo, hi = mean_interval(per_pass)
    pm, plo, phi = mean_interval(pooled)
    step = statistics.median(x for p in passes for x in p["off"]) * 1000
    spikes = "/".join(str(sum(p["spikes"][k] for p in passes)) for k in ("on", "off"))
    return (
        f"| {part} | {len(per_pass)} x {len(pooled) // max(1, len(per_pass))} | {step:.1f} "
        f"| {100 * m:+.1f}% ({100 * lo:+.1f}% to {100 * hi:+.1f}%) "
        f"| {100 * pm:+.1f}% ({100 * plo:+.1f}% to {100 * phi:+.1f}%) "
        f"| {' '.join(f'{100 * v:+.1f}%' for v in per_pass)} | {spikes} |"
    )


def main() -> None:
    from profile_overhead_layers import PARTS

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--example", default="slow_loader.py")
    ap.add_argument("--parts", nargs="+", default=["none", "all", "loader", "syncs", "models", "torch"],
                    choices=[*SPECIAL, *PARTS])  # fmt: skip
    ap.add_argument("--pairs", type=int, default=24, help="on/off block pairs a pass")
    ap.add_argument("--passes", type=int, default=3, help="fresh processes a part")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--worker", nargs=3, metavar=("EXAMPLE", "PART", "PAIRS"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        worker(a.worker[0], a.worker[1], int(a.worker[2]))
        return
    from pitstop.host.load import OtherCpu, load_average, load_line
    from pitstop.host.machine import machine_line
    from pitstop.measure import rotated

    core = max(os.sched_getaffinity(0))
    load0, other = load_average(), OtherCpu()
    started = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    seen: dict[str, list[dict[str, Any]]] = {p: [] for p in a.parts}
    for k in range(a.passes):
        for part in rotated(a.parts, k):
            seen[part].append(one_pass(a.example, part, a.pairs, core))
            print(f"pass {k + 1}/{a.passes} {part:9s} {row(part, seen[part])}", flush=True)
    lines = [
        f"# profile: {a.example}'s in-process instrument cost, one part at a time (on/off blocks)",
        "",
        f"- machine: {machine_line()}; each pass one process on core {core}, OMP_NUM_THREADS=1",
        f"- date: {started}",
        f"- load: {load_line(load0)}; other processes used {other.share():.0%} of the CPUs during the runs",
        f"- command: `{' '.join(['benchmarks/profile_overhead_part_blocks.py', *sys.argv[1:]])}`",
        f"- method: the module docstring; blocks of {BLOCK} steps after {LEAD} with everything on, the first "
        "step of each block left out; share = on / off - 1; 95% Student t intervals",
        "",
        "| switched | passes x pairs | off median ms/step | over passes (95% CI) | pairs pooled (95% CI) "
        "| per pass | spikes on/off |",
        "| --- | --- | --- | --- | --- | --- | --- |",
        *(row(part, passes) for part, passes in seen.items()),
    ]
    a.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
