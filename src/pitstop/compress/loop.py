"""A fixed number of optimizer steps over a loader: the fine-tune after pruning and the distillation loop.

Runs on ``pitstop.train.fit`` (one training loop for the whole project) in fp32, without channels_last
or compile, so a compression method is compared with its baseline without a precision or layout change
mixed in. Where ``pitstop.train`` cannot be imported, a plain loop does the same steps.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from pitstop.compress.measure import call_model, split_batch

ComputeLoss = Callable[[nn.Module, Any], torch.Tensor]


@dataclass(frozen=True)
class StepsResult:
    steps: int
    final_loss: float | None
    loop: str  # "pitstop.train" or "plain"


def classification_loss(model: nn.Module, batch: Any) -> torch.Tensor:
    x, y = split_batch(batch)
    if y is None:
        raise ValueError("training needs (input, target) batches")
    return nn.functional.cross_entropy(call_model(model, x), y)


def _epochs_for(loader: Iterable[Any], steps: int) -> int:
    try:
        n = len(loader)  # type: ignore[arg-type]
    except TypeError:
        return steps  # an unsized iterable: each pass may be short; max_steps stops the loop
    return max(1, -(-steps // max(n, 1)))


def run_steps(
    model: nn.Module,
    loader: Iterable[Any],
    steps: int,
    lr: float = 1e-3,
    compute_loss: ComputeLoss = classification_loss,
    seed: int | None = 0,
    optimizer: Callable[[nn.Module], torch.optim.Optimizer] | None = None,
) -> StepsResult:
    """Train ``model`` in place for ``steps`` optimizer steps (Adam(lr) unless ``optimizer`` is given)."""
    if steps <= 0:
        return StepsResult(0, None, "none")
    make_opt = optimizer or (
        lambda m: torch.optim.Adam([p for p in m.parameters() if p.requires_grad], lr=lr)
    )
    try:
        from pitstop.train import TrainConfig, fit
    except ImportError:
        return _plain_loop(model, loader, steps, compute_loss, seed, make_opt)
    device = next(model.parameters()).device
    cfg = TrainConfig(
        epochs=_epochs_for(loader, steps),
        max_steps=steps,
        lr=lr,
        precision="fp32",
        channels_last=False,
        compile=False,
        device=str(device),
        distributed="none",
        progress=False,
        seed=seed,
        log_every=max(steps, 1),
    )
    res = fit(model, make_opt, loader, config=cfg, compute_loss=compute_loss)
    model.eval()
    final = res.history[-1]["loss"] if res.history else None
    return StepsResult(res.steps, final, "pitstop.train")


def _plain_loop(
    model: nn.Module,
    loader: Iterable[Any],
    steps: int,
    compute_loss: ComputeLoss,
    seed: int | None,
    make_opt: Callable[[nn.Module], torch.optim.Optimizer],
) -> StepsResult:
    if seed is not None:
        torch.manual_seed(seed)
    opt = make_opt(model)
    model.train()
    done, loss = 0, None
    while done < steps:
        before = done
        for batch in loader:
            loss = compute_loss(model, batch)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            done += 1
            if done >= steps:
                break
        if done == before:
            raise ValueError("the training loader yielded no batches")
    model.eval()
    return StepsResult(done, None if loss is None else float(loss.detach()), "plain")
