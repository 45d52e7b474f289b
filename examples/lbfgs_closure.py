"""Full-batch LBFGS: ``optimizer.step(closure)``, the closure running forward and backward (several
times per step, as LBFGS's line search asks). `pitstop profile` counts one step per ``step(closure)``,
books the closure's forwards and backwards as forward and backward (not as optimizer time), and its
exit probes step the optimizer with a closure too.

    python examples/lbfgs_closure.py [--steps 40] [--samples 2048]
"""

import argparse

import torch
from torch import nn


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--samples", type=int, default=2048)
    ap.add_argument("--features", type=int, default=32)
    args = ap.parse_args()

    torch.manual_seed(0)
    x = torch.randn(args.samples, args.features)
    y = torch.sin(x[:, :1] * 3) + 0.1 * x[:, 1:2]
    model = nn.Sequential(
        nn.Linear(args.features, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1)
    )
    opt = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=4, history_size=10)
    loss_fn = nn.MSELoss()

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        return loss

    for step in range(args.steps):
        loss = opt.step(closure)
        if (step + 1) % 10 == 0:
            print(f"step {step + 1}: loss {float(loss):.4f}")


if __name__ == "__main__":
    main()
