"""The shape of the public PyTorch Hogwild MNIST example, on made-up data: one small CNN whose parameters
live in shared memory (``model.share_memory()``), trained at once by ``--processes`` children started
with ``torch.multiprocessing.Process``, each with its own optimizer and loader; the parent then runs a
test pass (no-grad forwards) on the shared model.

Images are random 1x28x28 tensors with labels from a fixed rule, so it needs no download and runs in
seconds on a CPU. ``--start-method`` picks how the children start (fork, spawn or forkserver).

    python examples/hogwild.py [--processes 2] [--samples 1024] [--start-method fork]
"""

import argparse

import torch
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn, optim
from torch.utils.data import DataLoader, TensorDataset


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 5)
        self.conv2 = nn.Conv2d(8, 16, 5)
        self.fc1 = nn.Linear(256, 32)
        self.fc2 = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2(x), 2))
        x = F.relu(self.fc1(torch.flatten(x, 1)))
        return F.log_softmax(self.fc2(x), dim=1)


def made_up(n: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    images = torch.randn(n, 1, 28, 28, generator=g)
    labels = (images[:, 0, :14, :14].sum((1, 2)) > 0).long() * 5 + (images[:, 0, 14:, 14:].mean((1, 2)) > 0)
    return TensorDataset(images, labels.long())


def train(rank: int, args: argparse.Namespace, model: Net) -> None:
    torch.manual_seed(args.seed + rank)
    loader = DataLoader(made_up(args.samples, args.seed + rank), batch_size=args.batch_size, shuffle=True)
    optimizer = optim.SGD(model.parameters(), lr=args.lr, momentum=0.5)
    model.train()
    for epoch in range(1, args.epochs + 1):
        for batch_idx, (data, target) in enumerate(loader):
            optimizer.zero_grad()
            loss = F.nll_loss(model(data), target)
            loss.backward()
            optimizer.step()
            if batch_idx % args.log_interval == 0:
                print(f"{mp.current_process().name} epoch {epoch} batch {batch_idx}: loss {loss.item():.4f}")


def test(args: argparse.Namespace, model: Net) -> None:
    model.eval()
    loader = DataLoader(made_up(args.samples // 4, args.seed + 1000), batch_size=256)
    loss, correct = 0.0, 0
    with torch.no_grad():
        for data, target in loader:
            output = model(data)
            loss += F.nll_loss(output, target, reduction="sum").item()
            correct += int((output.argmax(1) == target).sum())
    n = len(loader.dataset)
    print(f"Test set: average loss {loss / n:.4f}, accuracy {correct}/{n}")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--processes", type=int, default=2)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--samples", type=int, default=1024)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--log-interval", type=int, default=10)
    p.add_argument("--start-method", default="fork", choices=["fork", "spawn", "forkserver"])
    args = p.parse_args()
    mp.set_start_method(args.start_method, force=True)
    torch.manual_seed(args.seed)
    model = Net()
    model.share_memory()  # gradients are allocated per process; the parameters are shared
    processes = []
    for rank in range(args.processes):
        proc = mp.Process(target=train, args=(rank, args, model))
        proc.start()
        processes.append(proc)
    for proc in processes:
        proc.join()
    test(args, model)


if __name__ == "__main__":
    main()
