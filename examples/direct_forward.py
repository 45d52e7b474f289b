"""A loop that calls ``model.forward(x)`` instead of ``model(x)``. torch's module hooks do not run for
such a call, yet `pitstop profile` times it as the step's forward and finds the model (so the MFU and
precision probes run on it).

    python examples/direct_forward.py [--steps 60] [--batch-size 128]
"""

import argparse

import torch
from torch import nn


class Net(nn.Module):
    def __init__(self, features: int, hidden: int, classes: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(features, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.head = nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.fc1(x))
        x = torch.relu(self.fc2(x))
        return self.head(x)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--features", type=int, default=256)
    args = ap.parse_args()

    torch.manual_seed(0)
    n = args.batch_size * 8
    x_all = torch.randn(n, args.features)
    y_all = (x_all[:, :4].sum(1) > 0).long()
    model = Net(args.features, 512, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    loss_fn = nn.CrossEntropyLoss()
    for step in range(args.steps):
        idx = torch.randint(0, n, (args.batch_size,))
        loss = loss_fn(model.forward(x_all[idx]), y_all[idx])  # not model(...): no module hooks run
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if (step + 1) % 20 == 0:
            print(f"step {step + 1}: loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
