from __future__ import annotations

import pytest
import torch

from pitstop.recipes.activation_checkpointing import (
    apply_activation_checkpointing,
    remove_activation_checkpointing,
)
from pitstop.train.memory import TensorMemoryTracker, activation_memory_saving, peak_memory_bytes


def _blocks() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        *[
            torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.Dropout(0.1))
            for _ in range(6)
        ],
        torch.nn.Linear(64, 1),
    )


def _grads(model: torch.nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    torch.manual_seed(123)  # same dropout masks; checkpoint replays the RNG on recompute
    model(x).pow(2).mean().backward()
    out = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    return out


def test_checkpointing_changes_memory_not_gradients() -> None:
    torch.set_num_threads(1)
    x = torch.randn(256, 64)
    model = _blocks()
    plain = _grads(model, x)
    names = apply_activation_checkpointing(model, [torch.nn.Sequential])
    assert names == [str(i) for i in range(6)]  # the root is never wrapped; nested blocks once
    ckpt = _grads(model, x)
    for a, b in zip(plain, ckpt, strict=True):
        assert torch.equal(a, b)
    assert remove_activation_checkpointing(model) == 6

    without, with_ckpt = activation_memory_saving(
        model, ["0", "1", "2", "3", "4", "5"], x, lambda m, b: m(b).pow(2).mean()
    )
    # 6 blocks each keep ~3 activations of 256x64 fp32 (64 KiB each) without checkpointing.
    assert without - with_ckpt > 6 * 64 * 1024
    assert remove_activation_checkpointing(model) == 0  # measurement left the model unwrapped


def test_state_dict_keys_unchanged_and_eval_skips_checkpoint() -> None:
    model = _blocks()
    keys = list(model.state_dict())
    apply_activation_checkpointing(model, [lambda name, m: name == "2"])
    assert list(model.state_dict()) == keys
    with torch.no_grad():
        model(torch.randn(2, 64))


def test_no_match_is_an_error() -> None:
    with pytest.raises(ValueError, match="no submodule matched"):
        apply_activation_checkpointing(_blocks(), ["layers.99"])


def test_tracker_counts_allocations_and_frees() -> None:
    def work() -> None:
        a = torch.empty(1000, dtype=torch.float32)  # 4000 B
        b = torch.empty(500, dtype=torch.float32)  # 2000 B
        del a
        c = torch.empty(250, dtype=torch.float32)  # 1000 B; peak was a+b
        del b, c

    assert peak_memory_bytes(work) == 6000

    def views() -> None:  # views and in-place ops share the storage: counted once
        a = torch.empty(1000)
        b = a.view(10, 100).t()
        a.add_(1)
        del b

    assert peak_memory_bytes(views) == 4000
    with TensorMemoryTracker() as t:
        keep = torch.ones(10)
    assert t.current_bytes == 40 and keep.sum() == 10


def test_tracker_does_not_charge_in_place_updates_of_older_tensors() -> None:
    # A BatchNorm running stat or a parameter updated in place during the work allocates nothing.
    older = torch.zeros(1000)
    model = torch.nn.BatchNorm1d(8)

    def work() -> None:
        older.mul_(2)
        older[:10].add_(1)
        torch.add(older, 1, out=older)
        model(torch.randn(4, 8))  # updates running_mean/var in place; 128 B input, 128 B output

    assert peak_memory_bytes(work) < 4000
