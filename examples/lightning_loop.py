"""Planted problem: the input pipeline, in a PyTorch Lightning training loop.

A LightningModule (an MLP on made-up "text" records) whose DataLoader turns each record into features in
Python, with ``num_workers=0``: every step waits for the main process. With automatic optimization
Lightning runs the training step and backward inside ``optimizer.step(closure)``; `pitstop profile --
python examples/lightning_loop.py` counts them as forward and backward, and ranks `dataloader.workers`
first. ``--manual`` trains with manual optimization (``self.manual_backward``) instead.

    python examples/lightning_loop.py [--manual] [--epochs 20] [--records 512]
"""

import argparse
import warnings

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

FEATURES = 64


class Records(Dataset):
    """Made-up records parsed per item in Python (the kind of work a DataLoader worker should do)."""

    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.rows = [
            " ".join(f"w{int(v)}" for v in torch.randint(0, 500, (600,), generator=g)) for _ in range(n)
        ]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        counts = [0.0] * FEATURES
        for word in self.rows[i].split():
            counts[hash(word) % FEATURES] += 1.0
        x = torch.tensor(counts) / 600.0
        return x, (x[:4].sum() > x[4:8].sum()).long()


class Classifier(L.LightningModule):
    def __init__(self, manual: bool) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(FEATURES, 256), nn.ReLU(), nn.Linear(256, 2))
        self.automatic_optimization = not manual

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self(x), y)
        if not self.automatic_optimization:
            opt = self.optimizers()
            opt.zero_grad()
            self.manual_backward(loss)
            opt.step()
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--manual", action="store_true")
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--records", type=int, default=512)
    ap.add_argument("--batch-size", type=int, default=16)
    args = ap.parse_args()
    warnings.filterwarnings("ignore", ".*does not have many workers.*")
    torch.manual_seed(0)
    loader = DataLoader(Records(args.records), batch_size=args.batch_size, shuffle=True, num_workers=0)
    trainer = L.Trainer(
        max_epochs=args.epochs,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Classifier(args.manual), loader)


if __name__ == "__main__":
    main()
