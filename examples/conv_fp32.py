"""Planted problem: compute left on the table. A conv net trained in fp32, NCHW.

On hardware with fast low precision (AVX512_BF16/AMX CPUs, tensor-core GPUs) bf16/fp16 autocast and
channels_last make convolutions much cheaper. `pitstop profile -- python examples/conv_fp32.py` should
rank `precision.amp` (or `memory_format.channels_last`, whichever it measures as costlier) first.

    python examples/conv_fp32.py [--steps 40] [--batch-size 16] [--size 32]
"""

import argparse
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def block(c_in: int, c_out: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--size", type=int, default=32)
    args = ap.parse_args()

    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    images = torch.randn(args.batch_size * 8, 3, args.size, args.size)
    labels = torch.randint(0, 10, (args.batch_size * 8,))
    loader = DataLoader(
        TensorDataset(images, labels), batch_size=args.batch_size, shuffle=True, drop_last=True
    )

    model = nn.Sequential(
        block(3, 16),
        block(16, 32),
        nn.MaxPool2d(2),
        block(32, 64),
        block(64, 64),
        nn.MaxPool2d(2),
        block(64, 128),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(128, 10),
    ).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, foreach=True)
    loss_fn = nn.CrossEntropyLoss()

    step, t_start = 0, None
    while step < args.steps:
        for x, y in loader:
            if step == args.warmup:
                t_start = time.perf_counter()
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            loss = loss_fn(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
            if step >= args.steps:
                break
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
