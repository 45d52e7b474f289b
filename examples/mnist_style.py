"""The shape of the public PyTorch MNIST example, on made-up data: a small CNN, Adadelta with StepLR,
``num_workers=0``, a test pass after every epoch. Nothing is planted; it is the script `pitstop fix`
is judged on ("does it give a decided verdict for every candidate, with its interval?").

Images are random 1x28x28 tensors with labels from a fixed rule, so it needs no download and an epoch
takes seconds on a CPU (``--samples`` per epoch). The per-epoch test pass makes the first step of the
next epoch slow: the timing engine reports such steps as outliers. With ``EXAMPLE_STEP_TIMER=N`` set it
prints its training throughput after ``N`` warm-up steps, as the other examples do (it only times).

    python examples/mnist_style.py [--epochs 1] [--samples 2048] [--batch-size 64]
"""

import argparse
import os
import time

import torch
import torch.nn.functional as F
from torch import nn, optim
from torch.optim.lr_scheduler import StepLR
from torch.utils.data import DataLoader, TensorDataset


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = F.max_pool2d(x, 2)
        x = torch.flatten(self.dropout1(x), 1)
        x = self.dropout2(F.relu(self.fc1(x)))
        return F.log_softmax(self.fc2(x), dim=1)


def made_up(n: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    images = torch.randn(n, 1, 28, 28, generator=g)
    labels = (images[:, 0, :14, :14].sum((1, 2)) > 0).long() * 5 + (images[:, 0, 14:, 14:].mean((1, 2)) > 0)
    return TensorDataset(images, labels.long())


class StepTimer:
    """Wall time of the training steps after ``EXAMPLE_STEP_TIMER`` warm-up steps (off when unset)."""

    def __init__(self) -> None:
        self.warmup = int(os.environ.get("EXAMPLE_STEP_TIMER", "-1"))
        self.steps, self.start = 0, None

    def step(self) -> None:
        self.steps += 1
        if self.steps == self.warmup:
            self.start = time.perf_counter()

    def report(self, batch_size: int) -> None:
        if self.start is not None and self.steps > self.warmup:
            k, dt = self.steps - self.warmup, time.perf_counter() - self.start
            print(
                f"throughput: {k * batch_size / dt:.1f} samples/s over {k} steps ({1000 * dt / k:.2f} ms/step)"
            )


TIMER = StepTimer()


def train(args, model, device, train_loader, optimizer, epoch):
    model.train()
    for batch_idx, (data, target) in enumerate(train_loader):
        data, target = data.to(device), target.to(device)
        optimizer.zero_grad()
        output = model(data)
        loss = F.nll_loss(output, target)
        loss.backward()
        optimizer.step()
        TIMER.step()
        if batch_idx % args.log_interval == 0:
            print(
                f"Train Epoch: {epoch} [{batch_idx * len(data)}/{len(train_loader.dataset)}]\tLoss: {loss.item():.6f}"
            )


def test(model, device, test_loader):
    model.eval()
    test_loss, correct = 0.0, 0
    with torch.no_grad():
        for data, target in test_loader:
            data, target = data.to(device), target.to(device)
            output = model(data)
            test_loss += F.nll_loss(output, target, reduction="sum").item()
            correct += (output.argmax(dim=1) == target).sum().item()
    n = len(test_loader.dataset)
    print(f"Test set: Average loss: {test_loss / n:.4f}, Accuracy: {correct}/{n}")


def main():
    parser = argparse.ArgumentParser(description="MNIST-style example on made-up data")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--test-batch-size", type=int, default=1000)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--samples", type=int, default=2048, help="training images per epoch")
    parser.add_argument("--lr", type=float, default=1.0)
    parser.add_argument("--gamma", type=float, default=0.7)
    parser.add_argument("--log-interval", type=int, default=10)
    args = parser.parse_args()

    torch.manual_seed(1)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    train_loader = DataLoader(
        made_up(args.samples, 0), batch_size=args.batch_size, shuffle=True, num_workers=0
    )
    test_loader = DataLoader(made_up(1000, 1), batch_size=args.test_batch_size, num_workers=0)

    model = Net().to(device)
    optimizer = optim.Adadelta(model.parameters(), lr=args.lr)
    scheduler = StepLR(optimizer, step_size=1, gamma=args.gamma)
    for epoch in range(1, args.epochs + 1):
        train(args, model, device, train_loader, optimizer, epoch)
        test(model, device, test_loader)
        scheduler.step()
    TIMER.report(args.batch_size)


if __name__ == "__main__":
    main()
