"""Instrumentation overhead per rank of `pitstop profile -- torchrun ...` on a 2-rank gloo DDP job.

The workload times its own steps (every rank writes its median ms/step after a warm-up), so plain and
profiled runs are timed the same way. Runs alternate plain (`torchrun ...`) and profiled
(`pitstop profile --full --no-probes -- torchrun ...`: every rank instrumented for the whole run, comm
hook and collective wrappers included). The table gives, per rank, the median over the repeats and the
overhead of the medians; the requirement is < 5% of step time. The machine's load and the CPU time
other processes took during the runs are recorded with the result.

    .venv/bin/python benchmarks/profile_ranks_overhead.py [--repeats 3] [--steps 80]
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "profile_ranks_overhead.md"
sys.path.insert(0, str(ROOT / "src"))

from pitstop.host.load import OtherCpu, load_average, load_line  # noqa: E402

WORKLOAD = """
import os, statistics, sys, time
import torch, torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
torch.set_num_threads(1)
dist.init_process_group("gloo")
steps, warm = int(sys.argv[1]), 10
ds = TensorDataset(torch.randn(64 * (steps + warm), 256), torch.randint(0, 8, (64 * (steps + warm),)))
model = nn.parallel.DistributedDataParallel(
    nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 8)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
times, t = [], time.perf_counter()
for i, (x, y) in enumerate(DataLoader(ds, batch_size=64)):
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad(); loss.backward(); opt.step()
    now = time.perf_counter()
    if i >= warm:
        times.append(now - t)
    t = now
with open(os.path.join(os.environ["BENCH_OUT"], f"rank-{dist.get_rank()}.txt"), "w") as f:
    f.write(str(statistics.median(times) * 1000))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one_run(script: Path, steps: int, profiled: bool) -> dict[int, float]:
    out = Path(tempfile.mkdtemp(prefix="pitstop-bench-ranks-"))
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1",
                f"--master_port={free_port()}", str(script), str(steps)]  # fmt: skip
    cmd = [sys.executable, "-m", "pitstop", "profile", "--full", "--no-probes", "-q", "--", *torchrun]
    env = {**os.environ, "BENCH_OUT": str(out), "PYTHONPATH": str(ROOT / "src"), "MASTER_ADDR": "127.0.0.1"}
    subprocess.run(cmd if profiled else torchrun, env=env, check=True, capture_output=True, timeout=600)
    return {int(p.stem.split("-")[1]): float(p.read_text()) for p in out.glob("rank-*.txt")}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=80)
    a = ap.parse_args()
    script = Path(tempfile.mkdtemp(prefix="pitstop-bench-ranks-")) / "ddp_workload.py"
    script.write_text(WORKLOAD)
    load0 = load_average()
    other = OtherCpu()
    plain: dict[int, list[float]] = {0: [], 1: []}
    prof: dict[int, list[float]] = {0: [], 1: []}
    for _ in range(a.repeats):
        for rank, ms in one_run(script, a.steps, False).items():
            plain[rank].append(ms)
        for rank, ms in one_run(script, a.steps, True).items():
            prof[rank].append(ms)
    lines = [
        f"# profile overhead per rank (2-rank gloo DDP, {a.steps} steps, {a.repeats} repeats)",
        "",
        f"{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC; {load_line(load0)}; other processes used "
        f"{100 * other.share():.0f}% of the CPUs during the runs (a shared machine: figures are disturbed)",
        "",
        "| rank | plain median ms/step | profiled median ms/step | overhead (medians) | plain runs | profiled runs |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for rank in sorted(plain):
        p, q = statistics.median(plain[rank]), statistics.median(prof[rank])
        lines.append(
            f"| {rank} | {p:.2f} | {q:.2f} | {100 * (q / p - 1):+.1f}% | "
            f"{', '.join(f'{v:.2f}' for v in plain[rank])} | {', '.join(f'{v:.2f}' for v in prof[rank])} |"
        )
    text = "\n".join(lines) + "\n"
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
