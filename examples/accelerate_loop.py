"""Planted problem: host syncs, in an HF Accelerate training loop.

A plain loop prepared by ``accelerate.Accelerator`` (model, optimizer, DataLoader), ``accelerator.backward
(loss)`` for the backward pass, and per-sample accuracy, loss and confidence read one element at a time every step.
`pitstop profile -- python examples/accelerate_loop.py` should rank `sync.item` first, at that loop.

    python examples/accelerate_loop.py [--epochs 50] [--batch-size 256]
"""

import argparse

import torch
from accelerate import Accelerator
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Batched(Dataset):
    """In-memory features fetched a whole batch at a time (``__getitems__``): loading costs next to nothing."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.x)

    def __getitems__(self, idx: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        i = torch.tensor(idx)
        return self.x[i], self.y[i]


def as_is(batch: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    return batch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=50)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--features", type=int, default=64)
    args = ap.parse_args()
    torch.manual_seed(0)
    accelerator = Accelerator(cpu=True)
    x = torch.randn(args.batch_size * 16, args.features)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()
    loader = DataLoader(Batched(x, y), batch_size=args.batch_size, shuffle=True, collate_fn=as_is)
    model = nn.Sequential(nn.Linear(args.features, 256), nn.ReLU(), nn.Linear(256, 3))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, opt, loader = accelerator.prepare(model, opt, loader)
    correct: list[bool] = []
    sample_losses: list[float] = []
    confidence: list[float] = []
    for _ in range(args.epochs):
        for xb, yb in loader:
            logits = model(xb)
            per_sample = nn.functional.cross_entropy(logits, yb, reduction="none")
            loss = per_sample.mean()
            opt.zero_grad()
            accelerator.backward(loss)
            opt.step()
            probs = logits.detach().softmax(1)
            preds = probs.argmax(1)
            for i in range(len(yb)):  # the planted problem: host syncs per sample
                correct.append(bool(preds[i] == yb[i]))
                sample_losses.append(per_sample[i].item())
                confidence.append(float(probs[i, preds[i]]))
    accelerator.print(f"accuracy {sum(correct) / max(1, len(correct)):.3f}")


if __name__ == "__main__":
    main()
