"""Planted problem: host syncs. Per-sample results read one element at a time, every step.

An MLP classifier on in-memory features (bf16 autocast where the CPU has fast bf16); after each step the
script records whether each sample was classified correctly, one ``bool(...)`` per sample. On a GPU each
call stalls until the GPU has caught up; on CPU each one is still a round trip through the dispatcher,
inside a Python loop over the batch. `pitstop profile -- python examples/item_sync.py` should rank
`sync.item` first, pointing at the loop's line. The fix: ``(preds == y).tolist()`` once, or keep the
count on the device (``correct += (preds == y).sum()``) and read it every N steps; ``--fixed`` runs the
script with that fix applied by hand (``benchmarks/calibration.py`` times it against the planted loop).

    python examples/item_sync.py [--steps 40] [--batch-size 128] [--fixed]
"""

import argparse
import time
from pathlib import Path

import torch
from torch import nn


def fast_bf16() -> bool:
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--features", type=int, default=128)
    ap.add_argument(
        "--fixed", action="store_true", help="one .tolist() per step instead of a sync per sample"
    )
    args = ap.parse_args()

    torch.manual_seed(0)
    n = args.batch_size * 16
    x_all = torch.randn(n, args.features)
    y_all = (x_all[:, 0] > 0).long() + (x_all[:, 1] > 0).long()
    model = nn.Sequential(
        nn.Linear(args.features, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 3)
    )
    use_bf16 = fast_bf16()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=True)
    loss_fn = nn.CrossEntropyLoss(reduction="none")

    per_sample_correct: list[bool] = []
    t_start = None
    for step in range(args.steps):
        if step == args.warmup:
            t_start = time.perf_counter()
        idx = torch.randint(0, n, (args.batch_size,))
        x, y = x_all[idx], y_all[idx]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=use_bf16):
            logits = model(x)
            loss = loss_fn(logits, y).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        preds = logits.detach().argmax(1)
        if args.fixed:
            per_sample_correct.extend((preds == y).tolist())  # one sync for the whole batch
            continue
        for i in range(len(y)):  # the planted problem: one host sync per sample
            per_sample_correct.append(bool(preds[i] == y[i]))
    if t_start is not None:
        k = args.steps - args.warmup
        dt = time.perf_counter() - t_start
        print(
            f"throughput: {k * args.batch_size / dt:.1f} samples/s over {k} steps ({1000 * dt / k:.2f} ms/step)"
        )


if __name__ == "__main__":
    main()
