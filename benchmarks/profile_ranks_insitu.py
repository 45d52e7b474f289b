"""What `pitstop profile`'s per-step instruments cost each rank, switched off and on in the same processes.

A 2-rank gloo torchrun of the `profile_ranks_overhead.py` workload's model, with the rank's instruments
installed as `pitstop profile -- torchrun` installs them (`Instrumentation` + `RankWorker.on_install`).
After a warm-up, blocks of 100 steps alternate between everything on and the per-step instruments off
(the backward wrappers, the DDP forward and `_post_forward` wrappers with the reducer's timer logging
on pitstop's sample of iterations, the optimizer step hooks, the step boundary), both ranks switching at the same step. The
difference of each pair of blocks, in step time and in the main thread's CPU time, is averaged over the
pairs of a launch, and over launches with a 95% interval: the two arms run in the same processes, but
unpinned, how a launch's threads happen to be scheduled moves the difference itself (in one session,
+1.6% to +6.7% between launches of 30 pairs), so launches, not pairs, are the unit;
what is not switched (the loader wrappers, pitstop's threads, the parent) is in
`profile_ranks_overhead.py`'s end-to-end figures.

    flock /tmp/pitstop-bench.lock .venv/bin/python benchmarks/profile_ranks_insitu.py [--launches 6] [--pairs 12]

Runs unpinned and pinned (each rank on a core of its own) and writes
`benchmarks/results/profile_ranks_insitu.md`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "profile_ranks_insitu.md"
BLOCK = 100


def worker(pairs: int, out: Path) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.optim import optimizer as _o

    torch.set_num_threads(1)
    if os.environ.get("BENCH_PIN"):
        cores = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cores[int(os.environ["LOCAL_RANK"]) % len(cores)]})
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    tmp = Path(tempfile.mkdtemp(prefix="pitstop-insitu-"))
    DDP = nn.parallel.DistributedDataParallel
    names = ("backward", "autograd", "post_forward", "forward")

    def current() -> tuple:
        return (torch.Tensor.backward, torch.autograd.backward, DDP._post_forward, DDP.forward)

    plain = current()
    from pitstop.profile.capture.hooks import Config, Instrumentation
    from pitstop.profile.rank import ddp_timers
    from pitstop.profile.rank.rank_worker import RankWorker, identity

    inst = Instrumentation(Config(steps=10, warmup=5, full=True, out_dir=tmp, probes=False))
    inst.flush_path = tmp / "measurements.json"
    inst.install()
    RankWorker(identity(), tmp).on_install(inst)  # torchrun's variables
    model = DDP(
        nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 8))
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 256), torch.randint(0, 8, (64,))

    def step() -> None:
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()

    for _ in range(30):  # past the warm-up: the DDP forward wrapper is in place
        step()
    on = dict(zip(names, current(), strict=True))
    off = dict(zip(names, plain, strict=True))
    hooks = (dict(_o._global_optimizer_pre_hooks), dict(_o._global_optimizer_post_hooks))
    boundary = (inst.close_step, inst.boundary)

    def switch(enabled: bool) -> None:
        s = on if enabled else off
        torch.Tensor.backward, torch.autograd.backward = s["backward"], s["autograd"]
        DDP._post_forward, DDP.forward = s["post_forward"], s["forward"]
        for table, saved in zip(
            (_o._global_optimizer_pre_hooks, _o._global_optimizer_post_hooks), hooks, strict=True
        ):
            table.clear()
            if enabled:
                table.update(saved)
        if enabled:
            inst.close_step, inst.boundary = boundary
        else:
            inst.close_step = inst.boundary = lambda now: None
        model.reducer._set_ddp_runtime_logging_sample_rate(ddp_timers.SAMPLE if enabled else 100)

    def block() -> tuple[float, float]:
        t, c = time.perf_counter(), time.thread_time()
        for _ in range(BLOCK):
            step()
        return (time.perf_counter() - t) / BLOCK, (time.thread_time() - c) / BLOCK

    rows = []
    for i in range(pairs):
        got = {}
        for enabled in [True, False] if i % 2 == 0 else [False, True]:
            switch(enabled)
            got[enabled] = block()
        switch(True)
        rows.append({"on": got[True], "off": got[False]})
    (out / f"rank-{rank}.json").write_text(json.dumps(rows))
    os._exit(0)  # the instruments stay installed: leave without running torch's exit path


def interval(xs: list[float]) -> str:
    from profile_overhead_parts import mean_interval

    m, lo, hi = mean_interval(xs)
    if len(xs) < 2:
        return f"{1e6 * m:+.0f} us (one launch: no interval)"
    return f"{1e6 * m:+.0f} us (95% CI {1e6 * lo:+.0f} to {1e6 * hi:+.0f})"


def launch(pairs: int, pin: bool) -> dict[int, list[dict]]:
    from profile_ranks_overhead import free_port

    out = Path(tempfile.mkdtemp(prefix="pitstop-insitu-"))
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "BENCH_INSITU_OUT": str(out)}
    if pin:
        env["BENCH_PIN"] = "1"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1",
           f"--master_port={free_port()}", __file__, "--worker", "--pairs", str(pairs)]  # fmt: skip
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    ranks = {int(f.stem.split("-")[1]): json.loads(f.read_text()) for f in out.glob("rank-*.json")}
    if len(ranks) != 2:
        raise RuntimeError(f"a rank failed: {p.stderr[-2000:]}")
    return ranks


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=12, help="pairs of blocks in each launch")
    ap.add_argument("--launches", type=int, default=6, help="torchrun launches per configuration")
    ap.add_argument("--worker", action="store_true")
    a = ap.parse_args()
    if a.worker:
        worker(a.pairs, Path(os.environ["BENCH_INSITU_OUT"]))
        return 0
    sys.path.insert(0, str(ROOT / "benchmarks"))
    sys.path.insert(0, str(ROOT / "src"))
    from profile_ranks_overhead import machine

    from pitstop.host.load import OtherCpu, load_average, load_line

    start, load0, other = dt.datetime.now(dt.UTC), load_average(), OtherCpu()
    table, spread = [], []
    for pin in (False, True):
        # rank -> per launch: (mean step-time difference, mean CPU difference, median step off)
        per: dict[int, list[tuple[float, float, float]]] = {}
        for _ in range(a.launches):
            for rank, rows in sorted(launch(a.pairs, pin).items()):
                per.setdefault(rank, []).append((
                    statistics.fmean(r["on"][0] - r["off"][0] for r in rows),
                    statistics.fmean(r["on"][1] - r["off"][1] for r in rows),
                    statistics.median(r["off"][0] for r in rows),
                ))  # fmt: skip
        for rank, launches in sorted(per.items()):
            wall, cpu, off = ([x[i] for x in launches] for i in range(3))
            share = statistics.fmean(wall) / statistics.fmean(off)
            table.append(f"| {'yes' if pin else 'no'} | {rank} | {1e3 * statistics.median(off):.2f} | "
                         f"{interval(wall)} | {100 * share:+.1f}% | {interval(cpu)} |")  # fmt: skip
            spread.append(f"- pinned {'yes' if pin else 'no'}, rank {rank}: "
                          + ", ".join(f"{100 * w / o:+.1f}%" for w, _c, o in launches))  # fmt: skip
    text = "\n".join([
        f"# profile: per-step instruments of a rank, switched off and on in the same processes "
        f"({a.launches} launches of {a.pairs} pairs)",
        "",
        f"- date: {start:%Y-%m-%d %H:%M} UTC",
        f"- machine: {machine()}",
        f"- load: {load_line(load0)}; other processes used {100 * other.share():.0f}% of the CPUs during the runs",
        "- command: `flock /tmp/pitstop-bench.lock .venv/bin/python benchmarks/profile_ranks_insitu.py "
        f"--launches {a.launches} --pairs {a.pairs}`",
        f"- method: 2-rank gloo torchrun, the rank's instruments as `pitstop profile -- torchrun` installs them; "
        f"in each launch, pairs of {BLOCK}-step blocks, per-step instruments on / off (order alternating), both "
        "ranks switching at the same step; a launch's figure is the mean of its pair differences, and the "
        "table gives the mean over launches with a 95% Student t interval over launches (how the processes "
        "happen to be scheduled differs from one launch to the next, unpinned, and moves the difference too). "
        "Not switched: loader wrappers, pitstop's threads, the parent (see profile_ranks_overhead.md for "
        "end-to-end figures)",
        "",
        "| pinned | rank | step ms (off) | step time, on - off | share of the step | main-thread CPU, on - off |",
        "| --- | --- | --- | --- | --- | --- |",
        *table,
        "",
        "Step-time difference of each launch, as a share of its step:",
        "",
        *spread,
        "",
    ])  # fmt: skip
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
