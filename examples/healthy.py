"""No planted problem: the control. pitstop must say so instead of inventing one.

An MLP on in-memory data with the fast path already on: bf16 autocast where the CPU (AVX512_BF16/AMX)
or GPU (Ampere+) has fast bf16, a foreach optimizer, no host syncs in the loop (the loss is read every
100 steps), and on CPU freed memory kept mapped (``pitstop.train.keep_host_memory``; without it this
script page-faults a few hundred times a step, which `pitstop profile` measures at 5-10% of the step). `pitstop profile -- python examples/healthy.py` should report `summary.healthy`.

    python examples/healthy.py [--steps 40] [--batch-size 256]
"""

import argparse
import time
from pathlib import Path

import torch
from torch import nn


def fast_bf16(device: str) -> bool:
    if device == "cuda":
        return torch.cuda.is_bf16_supported()
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--features", type=int, default=256)
    args = ap.parse_args()

    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        from pitstop.train import keep_host_memory

        keep_host_memory()
    n = args.batch_size * 16
    x_all = torch.randn(n, args.features, device=device)
    y_all = (x_all[:, :4].sum(1) > 0).long()
    model = nn.Sequential(
        nn.Linear(args.features, 1024), nn.GELU(), nn.Linear(1024, 1024), nn.GELU(), nn.Linear(1024, 2)
    ).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    loss_fn = nn.CrossEntropyLoss()
    use_bf16 = fast_bf16(device)

    running = torch.zeros((), device=device)
    t_start = None
    for step in range(args.steps):
        if step == args.warmup:
            t_start = time.perf_counter()
        idx = torch.randint(0, n, (args.batch_size,), device=device)
        with torch.autocast(device, dtype=torch.bfloat16, enabled=use_bf16):
            loss = loss_fn(model(x_all[idx]), y_all[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        running += loss.detach()
        if (step + 1) % 100 == 0:
            print(f"step {step + 1}: loss {running.item() / 100:.4f}")
            running.zero_()
    if t_start is not None:
        if device == "cuda":
            torch.cuda.synchronize()
        k = args.steps - args.warmup
        dt = time.perf_counter() - t_start
        print(
            f"throughput: {k * args.batch_size / dt:.1f} samples/s over {k} steps ({1000 * dt / k:.2f} ms/step)"
        )


if __name__ == "__main__":
    main()
