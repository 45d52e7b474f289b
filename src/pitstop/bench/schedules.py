"""OneCycle vs StepLR: optimizer steps until a held-out accuracy target, on scikit-learn's digits (or a
learnable synthetic task when scikit-learn is missing). Same model, optimizer, peak LR, batch and step
horizon for both; only the schedule differs. Median over seeds."""

from __future__ import annotations

import functools
import statistics
import time
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.nn import functional as F


@dataclass
class ScheduleResult:
    task: str
    target_accuracy: float
    horizon: int  # steps each run may take
    steps_to_target: dict[str, list[int | None]] = field(default_factory=dict)  # None: target not reached
    seconds: float = 0.0

    def median_steps(self, name: str) -> float | None:
        """Median steps to target; a run that never reached it counts as the horizon (a lower bound)."""
        runs = self.steps_to_target.get(name) or []
        if not runs:
            return None
        return float(statistics.median(s if s is not None else self.horizon for s in runs))


@functools.cache
def _dataset() -> tuple[str, torch.Tensor, torch.Tensor]:
    try:
        from sklearn.datasets import load_digits

        d = load_digits()
        x = torch.tensor(d.data, dtype=torch.float32) / 16.0
        y = torch.tensor(d.target)
        task = "scikit-learn digits (1797 8x8 images, 10 classes)"
    except ImportError:
        from pitstop.bench.workloads import TeacherRows

        rows = TeacherRows(2000, 64, 10, seed=123)
        x, y = rows.x, rows.y
        task = "synthetic teacher task (2000 rows, 64 features, 10 classes)"
    return task, x, y


def _data(seed: int) -> tuple[str, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    task, x, y = _dataset()
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(len(x), generator=g)
    n_val = len(x) // 5
    val, tr = perm[:n_val], perm[n_val:]
    return task, x[tr], y[tr], x[val], y[val]


def steps_to_target(
    schedule: str,
    seed: int,
    target: float,
    horizon: int,
    lr: float = 0.05,
    batch: int = 32,
    eval_every: int = 5,
) -> tuple[str, int | None]:
    task, xtr, ytr, xval, yval = _data(seed)
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(xtr.shape[1], 64), nn.ReLU(), nn.Linear(64, 10))
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    if schedule == "onecycle":
        from pitstop.train import one_cycle

        sched: torch.optim.lr_scheduler.LRScheduler = one_cycle(opt, max_lr=lr, loader=horizon, epochs=1)
    else:
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=max(1, horizon // 3), gamma=0.1)
    g = torch.Generator().manual_seed(seed)
    for step in range(1, horizon + 1):
        idx = torch.randint(0, len(xtr), (batch,), generator=g)
        loss = F.cross_entropy(model(xtr[idx]), ytr[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        if step % eval_every == 0:
            with torch.no_grad():
                acc = (model(xval).argmax(1) == yval).float().mean().item()
            if acc >= target:
                return task, step
    return task, None


def compare_schedules(
    seeds: int = 5, target: float = 0.95, horizon: int = 600, progress: object = None
) -> ScheduleResult:
    t0 = time.perf_counter()
    res = ScheduleResult(task="", target_accuracy=target, horizon=horizon)
    for seed in range(seeds):
        for name in ("steplr", "onecycle"):
            task, n = steps_to_target(name, seed, target, horizon)
            res.task = task
            res.steps_to_target.setdefault(name, []).append(n)
        if callable(progress):
            progress(f"schedules seed {seed + 1}/{seeds}")
    res.seconds = time.perf_counter() - t0
    return res
