"""Knowledge distillation (Hinton et al. 2015): a student learns the teacher's softened class scores.

loss = alpha * T² * KL(softmax(teacher/T) || softmax(student/T)) + (1 - alpha) * CE(student, labels).
T² keeps the soft-target gradients on the same scale as the hard-label ones when T changes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from pitstop.compress.loop import StepsResult, run_steps
from pitstop.compress.measure import call_model, split_batch


def distillation_loss(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    target: torch.Tensor | None,
    T: float = 4.0,
    alpha: float = 0.9,
) -> torch.Tensor:
    """KL on temperature-softened logits (scaled by T²) mixed with cross-entropy on the labels.

    alpha=1: teacher only; alpha=0: labels only. ``target`` may be None only when alpha == 1.
    """
    if T <= 0:
        raise ValueError(f"temperature T must be > 0, got {T}")
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    soft = F.kl_div(
        F.log_softmax(student_logits / T, dim=-1),
        F.log_softmax(teacher_logits.detach() / T, dim=-1),
        reduction="batchmean",
        log_target=True,
    ) * (T * T)
    if alpha >= 1.0:
        return soft
    if target is None:
        raise ValueError("alpha < 1 mixes in the label loss and needs targets")
    return alpha * soft + (1.0 - alpha) * F.cross_entropy(student_logits, target)


def distill_compute_loss(
    teacher: nn.Module, T: float, alpha: float
) -> Callable[[nn.Module, Any], torch.Tensor]:
    """``compute_loss(student, batch)`` for a training loop: the teacher runs under no_grad in eval mode."""
    teacher.eval()

    def compute(student: nn.Module, batch: Any) -> torch.Tensor:
        x, y = split_batch(batch)
        out = call_model(student, x)
        if alpha <= 0.0:  # labels only: no teacher forward
            return F.cross_entropy(out, y)
        with torch.no_grad():
            t_out = call_model(teacher, x)
        return distillation_loss(out, t_out, y, T, alpha)

    return compute


def distill(
    teacher: nn.Module,
    student: nn.Module,
    loader: Iterable[Any],
    T: float = 4.0,
    alpha: float = 0.9,
    steps: int = 200,
    lr: float = 1e-3,
    seed: int | None = 0,
) -> StepsResult:
    """Train ``student`` in place for ``steps`` optimizer steps on the distillation loss.

    The teacher is frozen (eval, no_grad) and moved to the student's device. ``alpha=0`` trains on the
    labels alone: the same loop without the teacher, for a like-for-like baseline.
    """
    device = next(student.parameters()).device
    teacher = teacher.to(device)
    return run_steps(
        student, loader, steps, lr=lr, compute_loss=distill_compute_loss(teacher, T, alpha), seed=seed
    )
