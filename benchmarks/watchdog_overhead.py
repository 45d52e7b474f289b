"""Cost of the profile watchdog: a small training loop under pitstop's instrumentation, with and without
the watchdog thread, in one process, rounds interleaved; and the cost of one watchdog tick.

The watchdog adds nothing to the loop itself; what it can cost is its thread waking every 0.1 s and
taking the GIL for one tick (``--aa`` runs both arms without it, to see the noise floor). Prints ms/step (median over rounds) for both, their ratio, the tick's
mean time, and the machine's load during the measurement.

    PYTHONPATH=src .venv/bin/python benchmarks/watchdog_overhead.py [--rounds 8] [--steps 300]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
from torch import nn


def loop(steps: int, model: nn.Module, opt: torch.optim.Optimizer) -> float:
    x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
    t = time.perf_counter()
    for _ in range(steps):
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return (time.perf_counter() - t) / steps


def main() -> None:
    from pitstop.host.load import OtherCpu, load_average, load_line
    from pitstop.profile.capture.hooks import Config, Instrumentation
    from pitstop.profile.capture.watchdog import POLL_S, Watchdog

    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--aa", action="store_true", help="both arms without the watchdog: the noise floor")
    args = ap.parse_args()
    torch.set_num_threads(1)
    load0, other = load_average(), OtherCpu()
    out = Path(tempfile.mkdtemp(prefix="pitstop-wd-"))
    inst = Instrumentation(Config(full=True, warmup=5, out_dir=out))
    inst.install()
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loop(50, model, opt)  # warm-up
    plain, watched = [], []
    try:
        for _ in range(args.rounds):
            plain.append(loop(args.steps, model, opt))
            wd = Watchdog(inst) if args.aa else Watchdog(inst).start()
            watched.append(loop(args.steps, model, opt))
            if not args.aa:
                wd.stop()
        wd = Watchdog(inst)
        t = time.perf_counter()
        for _ in range(2000):
            wd._tick(time.perf_counter())
        tick = (time.perf_counter() - t) / 2000
    finally:
        inst.uninstall()
    a, b = statistics.median(plain), statistics.median(watched)
    print(f"instrumented loop, watchdog off: {a * 1000:.3f} ms/step (median of {args.rounds} rounds)")
    print(f"instrumented loop, watchdog on:  {b * 1000:.3f} ms/step ({100 * (b / a - 1):+.1f}%)")
    ratios = [w / p for p, w in zip(plain, watched, strict=True)]
    print(f"median of paired ratios: {100 * (statistics.median(ratios) - 1):+.1f}%")
    print(
        f"one watchdog tick: {tick * 1e6:.1f} us, every {POLL_S:g} s: {tick / POLL_S * 100:.3f}% of one core"
    )
    print(load_line(load0) + f"; other processes used {100 * other.share():.0f}% of the CPUs meanwhile")


if __name__ == "__main__":
    main()
