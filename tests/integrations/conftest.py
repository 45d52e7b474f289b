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
def line_of(request):
    """The line number in the calling test file of the line that holds ``text``."""
    lines = request.path.read_text().splitlines()
    return lambda text: next(i for i, line in enumerate(lines, 1) if text in line and "line_of(" not in line)


@pytest.fixture
def slow_dataset():
    return SlowDataset


@pytest.fixture
def patched_now():
    return patch_state


@pytest.fixture
def unpatched():
    """Fails the test if anything pitstop installs is still there afterwards (attributes a framework
    adds for itself, e.g. Lightning's ``DataLoader.__delattr__``, are not pitstop's)."""
    before = patch_state()
    yield before
    after = patch_state()
    changed = {k: (before.get(k), after[k]) for k in after if before.get(k) != after[k] and k in before}
    ours = [k for k in after if k not in before and _is_pitstop(k)]
    assert not changed and not ours, (changed, ours)
    assert all(k in after for k in before), set(before) - set(after)


def _is_pitstop(key: str) -> bool:
    owner_name, _, name = key.partition(".")
    owner = {
        c.__name__: c for c in (torch.Tensor, DataLoader, _BaseDataLoaderIter, torch.optim.Optimizer)
    }.get(owner_name)
    value = vars(owner).get(name) if owner is not None else None
    return "pitstop" in str(getattr(value, "__module__", "")) or "pitstop" in repr(
        getattr(value, "__code__", "")
    )
