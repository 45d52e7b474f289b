"""A model trained in float64 (``model.double()``, float64 batches, as numpy arrays give them): every
matmul runs at half the float32 rate or less. `pitstop profile` names it (``precision.float64``) with
the float32 gain measured on the script's model and last batch.

    python examples/float64_model.py [--steps 40] [--batch-size 256]
"""

import argparse

import numpy as np
import torch
from torch import nn


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--features", type=int, default=256)
    args = ap.parse_args()

    rng = np.random.default_rng(0)
    n = args.batch_size * 8
    x_all = torch.from_numpy(rng.standard_normal((n, args.features)))  # float64, as numpy makes it
    y_all = torch.from_numpy(x_all[:, :4].sum(1, keepdim=True).numpy() ** 2)
    model = nn.Sequential(
        nn.Linear(args.features, 512), nn.GELU(), nn.Linear(512, 512), nn.GELU(), nn.Linear(512, 1)
    ).double()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    loss_fn = nn.MSELoss()
    for step in range(args.steps):
        idx = torch.from_numpy(rng.integers(0, n, args.batch_size))
        loss = loss_fn(model(x_all[idx]), y_all[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if (step + 1) % 20 == 0:
            print(f"step {step + 1}: loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
