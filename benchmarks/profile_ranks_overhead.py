"""Instrumentation overhead per rank of `pitstop profile -- torchrun ...` on a 2-rank gloo DDP job.

The workload times its own steps, so plain (`torchrun ...`) and profiled
(`pitstop profile --full --no-probes -- torchrun ...`: every rank instrumented for the whole run, comm hook
and collective wrappers included) runs are timed the same way. Each round runs both, in an order rotated
every round (ABBA...), so drift of a shared machine falls on both alike.

Per rank: the overhead of step time as a ratio with its 95% interval over the rounds
(``pitstop.measure.speedup_interval`` on each round's step times), and the CPU seconds per step the rank
used over its timed steps (``getrusage``: all its threads, the backend's included), which other work on
the machine disturbs far less than wall time. Rank 0 also reads, over the same steps, the CPU time of the
launcher (torchrun) and of the process above it (`pitstop profile` in a profiled run). The requirement is
< 5% of step time per rank. The machine, its load and other processes' CPU share are recorded.

    flock /tmp/pitstop-bench.lock .venv/bin/python benchmarks/profile_ranks_overhead.py [--rounds 6] [--steps 200] [--pin]

With ``--nodes 2`` the two ranks are two nodes of one job (two torchrun agents on this machine, each
under its own `pitstop profile`): what a job across nodes adds per rank (the state shared through the store
once a second, the records copied at the end) is in the figures; results go to ``*_nodes.md``.

With ``--pin`` each rank runs on a core of its own: where two ranks share two cores unpinned, how the
scheduler places them and the backend's threads changes a run's step time by about 10% from one launch
to the next (this EPYC: s.d. of log median step time 0.09 unpinned, 0.03 pinned), which hides a few
percent of overhead in any number of rounds one can afford. Results go to ``profile_ranks_overhead_pinned.md``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "profile_ranks_overhead.md"
RESULTS_PINNED = ROOT / "benchmarks" / "results" / "profile_ranks_overhead_pinned.md"
sys.path.insert(0, str(ROOT / "src"))

from pitstop.host.load import OtherCpu, load_average, load_line  # noqa: E402
from pitstop.measure import Interval, rotated, speedup_interval  # noqa: E402

REQUIREMENT = 0.05
PLAIN, PROFILED = "plain", "profiled"

WORKLOAD = """
import json, os, resource, sys, time
import torch, torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
torch.set_num_threads(1)
if os.environ.get("BENCH_PIN"):  # this thread, and the backend's threads started after it, on one core
    cores = sorted(os.sched_getaffinity(0))
    which = os.environ["RANK" if os.environ["BENCH_PIN"] == "by-rank" else "LOCAL_RANK"]  # nodes share cores
    os.sched_setaffinity(0, {cores[int(which) % len(cores)]})
dist.init_process_group("gloo")
steps, warm = int(sys.argv[1]), 10
TICK = os.sysconf("SC_CLK_TCK")

def cpu_s(pid):  # user + system seconds of another process (clock ticks: long windows only)
    try:
        f = open(f"/proc/{pid}/stat").read().rsplit(") ", 1)[1].split()
        return (int(f[11]) + int(f[12])) / TICK, int(f[1])
    except (OSError, IndexError, ValueError):
        return 0.0, 0

def own_cpu_s():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime

ds = TensorDataset(torch.randn(64 * (steps + warm), 256), torch.randint(0, 8, (64 * (steps + warm),)))
model = nn.parallel.DistributedDataParallel(
    nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 8)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
times, t = [], time.perf_counter()
for i, (x, y) in enumerate(DataLoader(ds, batch_size=64)):
    if i == warm:
        launcher = os.getppid()
        c0 = own_cpu_s()
        l0, above = cpu_s(launcher)  # above the launcher: `pitstop profile`, or this benchmark
        a0, _ = cpu_s(above)
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad(); loss.backward(); opt.step()
    now = time.perf_counter()
    if i >= warm:
        times.append(now - t)
    t = now
n = len(times)
out = {"times": times, "cpu_s": (own_cpu_s() - c0) / n, "launcher_cpu_s": (cpu_s(launcher)[0] - l0) / n,
       "above_cpu_s": (cpu_s(above)[0] - a0) / n}
with open(os.path.join(os.environ["BENCH_OUT"], f"rank-{dist.get_rank()}.json"), "w") as f:
    json.dump(out, f)
del model, opt  # torch 2.14's gloo can abort at exit while a freed all-reduce still holds a Python object
__import__("gc").collect()
dist.barrier()
dist.destroy_process_group()
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launches(script: Path, steps: int, profiled: bool, nodes: int) -> list[list[str]]:
    """The commands of one launch: one torchrun of 2 ranks, or ``nodes`` torchrun agents of one rank each
    as the nodes of one job (static rendezvous on 127.0.0.1), each under its own `pitstop profile`."""
    port = free_port()
    per_node = 2 // nodes
    out = []
    for node in range(nodes):
        torchrun = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={per_node}",
                    f"--nnodes={nodes}", f"--node_rank={node}", "--master_addr=127.0.0.1",
                    f"--master_port={port}", str(script), str(steps)]  # fmt: skip
        profile = [sys.executable, "-m", "pitstop", "profile", "--full", "--no-probes", "-q", "--"]
        out.append([*profile, *torchrun] if profiled else torchrun)
    return out


def one_run(
    script: Path, steps: int, profiled: bool, pin: bool = False, tries: int = 3, nodes: int = 1
) -> dict[int, dict]:
    """Each rank's timed steps and CPU of one launch. A launch that fails is run again, with its error
    shown (seen here: a rank aborted by gloo, in plain runs as in profiled ones)."""
    for attempt in range(tries):
        out = Path(tempfile.mkdtemp(prefix="pitstop-bench-ranks-"))
        env = {
            **os.environ,
            "BENCH_OUT": str(out),
            "PYTHONPATH": str(ROOT / "src"),
            "MASTER_ADDR": "127.0.0.1",
        }
        if pin:
            env["BENCH_PIN"] = "1" if nodes == 1 else "by-rank"
        # each launch in a session of its own, as `pitstop profile` starts the script: with autogroup
        # scheduling a session is a scheduling group, so a plain launch left in the benchmark's session
        # would share one group's CPU share while the profiled one gets its own
        procs = [
            subprocess.Popen(
                cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
            )
            for cmd in launches(script, steps, profiled, nodes)
        ]
        ends = [p.communicate(timeout=600) for p in procs]
        ranks = {int(f.stem.split("-")[1]): json.loads(f.read_text()) for f in out.glob("rank-*.json")}
        if all(p.returncode == 0 for p in procs) and len(ranks) == 2:
            return ranks
        print(f"run failed (try {attempt + 1} of {tries}): {ends[-1][1][-1500:]}", file=sys.stderr)
    raise RuntimeError("a launch failed every try")


def overhead(iv: Interval | None) -> str:
    """'+3.1% (95% CI -0.4% to +6.8%)': candidate time over baseline time, from a speed-up interval."""
    if iv is None:
        return "n/a"
    est, lo, hi = 1 / iv.estimate - 1, 1 / iv.hi - 1, (1 / iv.lo - 1 if iv.lo > 0 else float("inf"))
    return f"{100 * est:+.1f}% (95% CI {100 * lo:+.1f}% to {100 * hi:+.1f}%)"


def verdict(iv: Interval | None) -> str:
    if iv is None:
        return "no figure"
    hi = 1 / iv.lo - 1 if iv.lo > 0 else float("inf")
    lo = 1 / iv.hi - 1
    if hi < REQUIREMENT:
        return "met (the whole interval is under 5%)"
    if lo > REQUIREMENT:
        return "not met (the whole interval is over 5%)"
    return f"not shown either way (the interval reaches {100 * hi:+.1f}%)"


def machine() -> str:
    from pitstop.host.cpu import cpu_flags
    from pitstop.host.machine import machine_line

    flags = cpu_flags()
    isa = [f for f in ("avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16") if f in flags]
    return f"{machine_line()}; CPU flags: {', '.join(isa) or 'none of avx2/avx512/amx'}"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--pin", action="store_true", help="each rank's main thread on a core of its own")
    ap.add_argument("--nodes", type=int, choices=(1, 2), default=1,
                    help="2: two torchrun agents of one rank each, as two nodes of one job, each profiled by its own pitstop")  # fmt: skip
    a = ap.parse_args()
    script = Path(tempfile.mkdtemp(prefix="pitstop-bench-ranks-")) / "ddp_workload.py"
    script.write_text(WORKLOAD)
    start = dt.datetime.now(dt.UTC)
    load0 = load_average()
    other = OtherCpu()
    runs: dict[str, list[dict[int, dict]]] = {PLAIN: [], PROFILED: []}
    for r in range(a.rounds):
        for name in rotated([PLAIN, PROFILED], r):
            runs[name].append(one_run(script, a.steps, name == PROFILED, a.pin, nodes=a.nodes))
    share, load_text = other.share(), load_line(load0)

    def per_round(name: str, rank: int, key: str) -> list[list[float]]:
        return [run[rank][key] if key == "times" else [run[rank][key]] for run in runs[name]]

    def mean_ms(name: str, key: str) -> float:
        """Rank 0's reading of a process outside the ranks, in ms per step, averaged over the rounds: one
        round's window holds few clock ticks of a process that is mostly asleep."""
        return 1000 * statistics.fmean(run[0][key] for run in runs[name])

    def ms(name: str, rank: int, key: str) -> float:
        """Median over rounds, in ms per step, of a run's median step time or of its CPU per step."""
        one = (
            (lambda run: statistics.median(run[rank]["times"]))
            if key == "times"
            else (lambda run: run[rank][key])
        )
        return 1000 * statistics.median(one(run) for run in runs[name])

    lines = [
        f"# profile overhead per rank (2-rank gloo DDP{', as 2 nodes' if a.nodes == 2 else ''}, {a.steps} timed "
        f"steps a run, {a.rounds} rounds)",
        "",
        f"- date: {start:%Y-%m-%d %H:%M} UTC",
        f"- machine: {machine()}",
        f"- load: {load_text}; other processes used {100 * share:.0f}% of the CPUs during the runs",
        "- command: `flock /tmp/pitstop-bench.lock .venv/bin/python benchmarks/profile_ranks_overhead.py "
        f"--rounds {a.rounds} --steps {a.steps}{' --pin' if a.pin else ''}{' --nodes 2' if a.nodes == 2 else ''}`",
        "- method: each round runs `torchrun` plain and under `pitstop profile --full --no-probes`, the order "
        "rotated every round; overhead = profiled / plain, geometric mean over rounds of the ratio of "
        "median step times (CPU: of CPU seconds per timed step), 95% Student t interval over rounds "
        "(`pitstop.measure.speedup_interval`)",
        "- ranks pinned: "
        + (
            "yes: each rank's main thread, and the gloo threads it starts, on a core of its own "
            "(`os.sched_setaffinity` in the workload, as a launcher's core binding does); pitstop's threads, "
            "started before the script, keep the whole CPU set"
            if a.pin
            else "no: the scheduler places the ranks' threads"
        ),
        "",
        "| rank | plain ms/step | profiled ms/step | step time overhead | plain CPU ms/step | profiled CPU ms/step "
        "| CPU overhead | requirement < 5% (step time) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    ranks = sorted(runs[PLAIN][0])
    for rank in ranks:
        wall = speedup_interval(per_round(PLAIN, rank, "times"), per_round(PROFILED, rank, "times"))
        cpu = speedup_interval(per_round(PLAIN, rank, "cpu_s"), per_round(PROFILED, rank, "cpu_s"))
        lines.append(
            f"| {rank} | {ms(PLAIN, rank, 'times'):.2f} | {ms(PROFILED, rank, 'times'):.2f} | {overhead(wall)} "
            f"| {ms(PLAIN, rank, 'cpu_s'):.3f} | {ms(PROFILED, rank, 'cpu_s'):.3f} | {overhead(cpu)} | {verdict(wall)} |"
        )
    lines += [
        "",
        "CPU outside the ranks over the same steps (rank 0's reading of /proc in clock ticks of "
        f"{1000 / os.sysconf('SC_CLK_TCK'):.0f} ms; ms per step, mean over rounds; one tick over all rounds "
        f"is {1000 / os.sysconf('SC_CLK_TCK') / (a.steps * a.rounds):.3f} ms per step):",
        "",
        f"- launcher (torchrun): plain {mean_ms(PLAIN, 'launcher_cpu_s'):.3f}, "
        f"profiled {mean_ms(PROFILED, 'launcher_cpu_s'):.3f}",
        f"- `pitstop profile` parent (profiled runs): {mean_ms(PROFILED, 'above_cpu_s'):.3f}",
        "",
        "Per round (rank 0 / rank 1 median ms/step): plain "
        + "; ".join(_medians(r) for r in runs[PLAIN])
        + "; profiled "
        + "; ".join(_medians(r) for r in runs[PROFILED]),
    ]
    text = "\n".join(lines) + "\n"
    out = RESULTS_PINNED if a.pin else RESULTS
    if a.nodes == 2:  # the job across nodes: ranks share their states through the store every second
        out = out.with_name(out.stem + "_nodes.md")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(text)
    return 0


def _medians(run: dict[int, dict]) -> str:
    return "/".join(f"{1000 * statistics.median(run[k]['times']):.2f}" for k in sorted(run))


if __name__ == "__main__":
    sys.exit(main())
