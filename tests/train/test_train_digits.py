"""bf16 autocast trains to the same accuracy band as fp32 on scikit-learn's digits (shipped, no download)."""

from __future__ import annotations

import pytest
import torch

from pitstop.train import TrainConfig, evaluate, fit

sklearn_datasets = pytest.importorskip("sklearn.datasets")


def _loaders() -> tuple[torch.utils.data.DataLoader, torch.utils.data.DataLoader]:
    d = sklearn_datasets.load_digits()
    x = torch.tensor(d.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(d.target)
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
    tr, te = perm[:1400], perm[1400:]
    g = torch.Generator().manual_seed(1)
    train = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(x[tr], y[tr]), batch_size=64, shuffle=True, generator=g
    )
    test = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x[te], y[te]), batch_size=256)
    return train, test


def _train(precision: str) -> tuple[float, str]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(1, 16, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Flatten(),
        torch.nn.Linear(16 * 16, 64),
        torch.nn.ReLU(),
        torch.nn.Linear(64, 10),
    )
    train, test = _loaders()
    cfg = TrainConfig(epochs=4, precision=precision, schedule="onecycle", max_lr=1e-2, progress=False)
    res = fit(model, None, train, torch.nn.functional.cross_entropy, cfg)
    acc = evaluate(model, test, torch.nn.functional.cross_entropy)["accuracy"]  # evaluated in fp32
    return acc, res.applied["precision"]


@pytest.mark.slow
def test_bf16_matches_fp32_accuracy_band_on_digits() -> None:
    torch.set_num_threads(1)
    acc32, p32 = _train("fp32")
    acc16, p16 = _train("bf16")
    assert (p32, p16) == ("fp32", "bf16")
    assert acc32 > 0.9, acc32
    assert acc16 > 0.9, acc16
    assert abs(acc32 - acc16) < 0.03, (acc32, acc16)
