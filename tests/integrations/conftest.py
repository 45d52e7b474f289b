"""Shared for the integration tests: a planted slow dataset and a fingerprint of what pitstop patches."""

from __future__ import annotations

import time
import warnings

import pytest
import torch
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.dataloader import _BaseDataLoaderIter


class SlowDataset(Dataset):
    """Each item costs a few ms to load: with num_workers=0 the step waits for data."""

    def __init__(self, n: int = 256, delay_s: float = 0.004) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 8, generator=g)
        self.y = torch.randint(0, 2, (n,), generator=g)
        self.delay_s = delay_s

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        time.sleep(self.delay_s)  # the planted cost: disk or decoding in a real loader
        return self.x[i], self.y[i]


def patch_state() -> dict[str, object]:
    """Everything the instrumentation patches or registers, by identity and count."""
    from torch.nn.modules import module as nn_module
    from torch.optim import optimizer as optim_module

    state: dict[str, object] = {}
    for owner in (torch.Tensor, DataLoader, _BaseDataLoaderIter, torch.optim.Optimizer):
        for name, value in vars(owner).items():
            state[f"{owner.__name__}.{name}"] = id(value)
    state["warnings.showwarning"] = id(warnings.showwarning)
    state["global_forward_pre_hooks"] = len(nn_module._global_forward_pre_hooks)
    state["global_forward_hooks"] = len(nn_module._global_forward_hooks)
    state["optimizer_pre_hooks"] = len(optim_module._global_optimizer_pre_hooks)
    state["optimizer_post_hooks"] = len(optim_module._global_optimizer_post_hooks)
    return state


@pytest.fixture
def slow_dataset():
    return SlowDataset


@pytest.fixture
def patched_now():
    return patch_state


@pytest.fixture
def unpatched():
    """Fails the test if anything pitstop installs is still there afterwards."""
    before = patch_state()
    yield before
    after = patch_state()
    assert after == before, {
        k: (before.get(k), after.get(k))
        for k in before.keys() | after.keys()
        if before.get(k) != after.get(k)
    }
