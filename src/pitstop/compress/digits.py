"""A small, self-contained workload for trying ``pitstop compress`` and for its tests and benchmark:
scikit-learn's 8x8 digits (shipped with scikit-learn, no download), an MLP and a small CNN.

    pitstop compress report --model pitstop.compress.digits:trained_mlp --data pitstop.compress.digits:test_loader

Deterministic: a fixed split and fixed seeds, so two calls give the same trained weights.
"""

from __future__ import annotations

import functools

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

TRAIN_ROWS = 1400  # of 1797; the remaining 397 are the test split


@functools.cache
def _arrays() -> tuple[torch.Tensor, torch.Tensor]:
    try:
        from sklearn.datasets import load_digits
    except ImportError as e:  # scikit-learn is a dev dependency of pitstop
        raise RuntimeError("the digits workload needs scikit-learn (pip install scikit-learn)") from e
    d = load_digits()
    x = torch.tensor(d.data, dtype=torch.float32).view(-1, 1, 8, 8) / 16.0
    y = torch.tensor(d.target, dtype=torch.int64)
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    return x[perm], y[perm]


def split(name: str, rows: int | None = None) -> TensorDataset:
    """``train`` (1400 rows, or the first ``rows`` of them) or ``test`` (397 rows); images [1, 8, 8]."""
    x, y = _arrays()
    if name == "train":
        end = TRAIN_ROWS if rows is None else min(rows, TRAIN_ROWS)
        return TensorDataset(x[:end], y[:end])
    if name == "test":
        return TensorDataset(x[TRAIN_ROWS:], y[TRAIN_ROWS:])
    raise ValueError(f"split must be 'train' or 'test', got {name!r}")


def train_loader(batch_size: int = 64, rows: int | None = None) -> DataLoader:
    """Shuffled from torch's global RNG, so a training loop's seed fixes the batch order of every run."""
    return DataLoader(split("train", rows), batch_size=batch_size, shuffle=True)


def few_label_loader() -> DataLoader:
    """50 labelled rows, batch 32: the regime where distillation measurably beats labels alone."""
    return train_loader(batch_size=32, rows=50)


def test_loader(batch_size: int = 64) -> DataLoader:
    return DataLoader(split("test"), batch_size=batch_size)


def mlp(hidden: int = 256, depth: int = 2) -> nn.Module:
    """Flatten -> ``depth`` x (Linear(hidden) + ReLU) -> Linear(10)."""
    layers: list[nn.Module] = [nn.Flatten()]
    width = 64
    for _ in range(depth):
        layers += [nn.Linear(width, hidden), nn.ReLU()]
        width = hidden
    layers.append(nn.Linear(width, 10))
    return nn.Sequential(*layers)


def cnn() -> nn.Module:
    """Two 3x3 convs (16, 32 channels) -> average pool to 2x2 -> Linear(10)."""
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(2),
        nn.Flatten(),
        nn.Linear(128, 10),
    )


def conv_only() -> nn.Module:
    """A CNN with no Linear layer (1x1 conv head): dynamic int8 does not apply to it."""
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(16, 10, 1),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
    )


def fit(
    model: nn.Module, steps: int = 300, lr: float = 3e-3, seed: int = 0, rows: int | None = None
) -> nn.Module:
    """Train ``model`` briefly on the train split (Adam, batch 64, fixed seed) and return it in eval mode."""
    from pitstop.compress.loop import run_steps

    run_steps(model, train_loader(rows=rows), steps, lr=lr, seed=seed)
    return model.eval()


def trained_mlp() -> nn.Module:
    """The MLP (64-256-256-10) trained 300 steps; about 96-97% test accuracy."""
    torch.manual_seed(0)
    return fit(mlp())


def trained_cnn() -> nn.Module:
    """The small CNN trained 300 steps; about 97% test accuracy."""
    torch.manual_seed(0)
    return fit(cnn(), lr=1e-2)


def trained_conv_only() -> nn.Module:
    torch.manual_seed(0)
    return fit(conv_only(), steps=400, lr=1e-2)


def student_mlp() -> nn.Module:
    """A small student for the MLP teacher: one hidden layer of 32 (about 20x fewer parameters)."""
    return mlp(hidden=32, depth=1)
