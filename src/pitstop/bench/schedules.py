"""OneCycle vs StepLR: the shortest run that reaches a held-out accuracy target, on scikit-learn's
digits (or a learnable synthetic task when scikit-learn is missing). Same model, SGD with momentum,
peak LR and batch for both; each schedule is laid out over the run's length, and run lengths grow 1.5x
(40, 60, ... 1000 steps) until the final accuracy reaches the target. Median over seeds."""

from __future__ import annotations

import functools
import statistics
import time
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.nn import functional as F

from pitstop.measure.clock import Stopwatch


@dataclass
class ScheduleResult:
    task: str
    target_accuracy: float
    horizon: int  # the longest run tried
    steps_to_target: dict[str, list[int | None]] = field(default_factory=dict)  # None: target not reached
    accuracy: dict[str, list[dict[int, float]]] = field(default_factory=dict)  # per seed: run length -> acc
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


LADDER = (40, 60, 90, 135, 200, 300, 450, 675, 1000)


def final_accuracy(
    schedule: str, seed: int, horizon: int, lr: float = 0.05, batch: int = 32
) -> tuple[str, float]:
    """Train for exactly ``horizon`` steps with the schedule laid out over that horizon; held-out accuracy."""
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
    for _ in range(horizon):
        idx = torch.randint(0, len(xtr), (batch,), generator=g)
        loss = F.cross_entropy(model(xtr[idx]), ytr[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
    with torch.no_grad():
        return task, (model(xval).argmax(1) == yval).float().mean().item()


def steps_to_target(
    schedule: str, seed: int, target: float, ladder: tuple[int, ...] = LADDER
) -> tuple[str, int | None, dict[int, float]]:
    """The shortest run (from ``ladder``) whose final held-out accuracy reaches ``target``.

    Both schedules depend on the run length (OneCycle's warm-up/anneal, StepLR's drops at 1/3 and 2/3),
    so "steps to accuracy" means: how short can the whole run be and still get there.
    """
    task, accs = "", {}
    for h in ladder:
        task, accs[h] = final_accuracy(schedule, seed, h)
        if accs[h] >= target:
            return task, h, accs
    return task, None, accs


def compare_schedules(
    seeds: int = 3,
    target: float = 0.95,
    ladder: tuple[int, ...] = LADDER,
    progress: object = None,
    deadline: float | None = None,
) -> ScheduleResult:
    """Steps to ``target`` of each schedule over ``seeds`` seeds; a seed after the first is not started
    when, at the last seed's pace, it would end past ``deadline`` (time.monotonic())."""
    watch = Stopwatch()
    res = ScheduleResult(task="", target_accuracy=target, horizon=max(ladder))
    for seed in range(seeds):
        if seed and deadline is not None and time.monotonic() + watch.elapsed() / seed > deadline:
            break
        for name in ("steplr", "onecycle"):
            task, n, accs = steps_to_target(name, seed, target, ladder)
            res.task = task
            res.steps_to_target.setdefault(name, []).append(n)
            res.accuracy.setdefault(name, []).append(accs)
        if callable(progress):
            progress(f"schedules seed {seed + 1}/{seeds}")
    res.seconds = watch.elapsed()
    return res
