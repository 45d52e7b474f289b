"""What following a torch.multiprocessing child costs it once, at start-up and at exit (not per step).

The workload starts ``--children`` children one after another (start method fork, spawn or forkserver);
each reads its own CPU time (``time.process_time``) as its target begins, runs 3 tiny training steps and
ends. The parent reads the children's CPU time in all from ``getrusage(RUSAGE_CHILDREN)`` once each is
joined (forkserver children are the server's, so that column is 0 there). Run plain (``python``) and under
``pitstop profile --full --no-probes``, in an order rotated every round; CPU time is what other work on a
shared machine disturbs least. Reported per start method: medians over the rounds of each figure, plain and
followed, and the difference; with the machine, its load and the start time.

    .venv/bin/python benchmarks/profile_children_startup.py [--rounds 4] [--children 6] [--methods fork spawn]
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

WORKLOAD = """
import os, resource, statistics, sys, time
import torch
import torch.multiprocessing as mp

def child(q):
    q.put(time.process_time())
    m = torch.nn.Linear(4, 1)
    o = torch.optim.SGD(m.parameters(), lr=0.1)
    for _ in range(3):
        m(torch.randn(2, 4)).sum().backward()
        o.step()
        o.zero_grad()

def cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime

if __name__ == "__main__":
    ctx = mp.get_context(sys.argv[1])
    before, total = [], []
    for _ in range(int(sys.argv[2])):
        q = ctx.Queue()
        p = ctx.Process(target=child, args=(q,))
        c0 = cpu()
        p.start()
        before.append(q.get())
        p.join()
        total.append(cpu() - c0)
    print(f"RESULT {statistics.median(before)} {statistics.median(total)}", file=sys.stderr)
"""
SRC = Path(__file__).resolve().parents[1] / "src"
sys.path.insert(0, str(SRC))
from pitstop.host.load import load_average, load_line  # noqa: E402
from pitstop.host.machine import machine_line  # noqa: E402


def once(script: Path, method: str, children: int, followed: bool) -> tuple[float, float]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(SRC)}
    cmd = [sys.executable, str(script), method, str(children)]
    if followed:
        cmd = [sys.executable, "-m", "pitstop", "profile", "--full", "--no-probes", "-q", "--", *cmd]
    err = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900, check=True).stderr
    m = re.search(r"RESULT (\S+) (\S+)", err)
    if m is None:
        raise RuntimeError(f"no result from {' '.join(cmd)}:\n{err[-2000:]}")
    return float(m.group(1)), float(m.group(2))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--children", type=int, default=6)
    p.add_argument("--methods", nargs="+", default=["fork", "spawn"])
    args = p.parse_args()
    print(f"{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC, {machine_line()}")
    load0 = load_average()
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp, "workload.py")
        script.write_text(WORKLOAD)
        for method in args.methods:
            runs: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
            for r in range(args.rounds):
                for followed in (False, True) if r % 2 == 0 else (True, False):
                    runs[followed].append(once(script, method, args.children, followed))
            med = {k: [statistics.median(x[i] for x in v) * 1000 for i in (0, 1)] for k, v in runs.items()}
            print(f"{method}: child CPU before its target {med[False][0]:.0f} -> {med[True][0]:.0f} ms "
                  f"({med[True][0] - med[False][0]:+.0f}), child CPU in all {med[False][1]:.0f} -> "
                  f"{med[True][1]:.0f} ms ({med[True][1] - med[False][1]:+.0f}); medians of {args.rounds} rounds "
                  f"of {args.children} children")  # fmt: skip
    print(load_line(load0))


if __name__ == "__main__":
    main()
