"""What every exit probe uses (``probes``, ``gpu_probes``, ``thread_probe``, ``probe_float64``, ``mfu``):
one forward+backward of the script's model (``fwd_bwd``) under the autocast the script ran
(``as_script``), variants timed in rotating rounds through ``pitstop.measure`` (``timed``) and the
saving one variant measured over another, with its interval (``saving``).
"""

from __future__ import annotations

import contextlib
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from pitstop.measure import Arm, Interval, Settings, interleave
from pitstop.measure.clock import time_block, time_calls
from pitstop.measure.plan import budget_for_rounds
from pitstop.recipes import autocast

PROBE_BUDGET_S, PROBE_BUDGET_CAP_S = 6.0, 30.0  # one probe's rounds; scaled up to the cap for slow passes
PROBE_ROUNDS = 3  # rounds the budget must hold: the sequential rule's first look
MAX_COPY_BYTES = 1 << 30  # the optimizer probe copies params, grads and state


def sync(device_type: str) -> None:
    if device_type == "cuda":
        torch.cuda.synchronize()


def first_grad_tensor(out: Any, depth: int = 0) -> torch.Tensor | None:
    if isinstance(out, torch.Tensor):
        return out if out.requires_grad and out.is_floating_point() else None
    if depth > 3:
        return None
    items = out.values() if isinstance(out, dict) else out if isinstance(out, list | tuple) else []
    for o in items:
        t = first_grad_tensor(o, depth + 1)
        if t is not None:
            return t
    return None


def fwd_bwd(model: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor:
    """Forward and backward from the output's first differentiable tensor; returns the scalar the
    backward ran from (zero where the output has none), as an optimizer closure returns its loss."""
    model.zero_grad(set_to_none=True)
    out = model(*args, **kwargs)
    t = first_grad_tensor(out)
    if t is None:
        return torch.zeros(())
    loss = t.float().mean()
    loss.backward()
    return loss.detach()


@dataclass
class Timed:
    """Median seconds per call of each variant, and each later variant's speed-up over the first with
    its 95% interval (``pitstop.measure``; None when fewer than two rounds fitted the budget), and the
    budget the rounds had (scaled with the variants' time, ``probe_budget``)."""

    medians: dict[str, float]
    intervals: dict[str, Interval | None] = field(default_factory=dict)
    budget_s: float | None = None
    scaled: bool = False  # the budget was raised for slow variants


def probe_budget(round_s: float, budget_s: float = PROBE_BUDGET_S) -> float:
    """Seconds for one probe's rounds: ``budget_s``, or as long as ``PROBE_ROUNDS`` rounds of
    ``round_s`` take where its variants are slow, at most ``PROBE_BUDGET_CAP_S``."""
    return budget_for_rounds(round_s, PROBE_ROUNDS, budget_s, PROBE_BUDGET_CAP_S)


def timed(
    variants: dict[str, Callable[[], None]], device_type: str, reps: int = 5, budget_s: float = PROBE_BUDGET_S
) -> Timed:
    """Rotating rounds of the variants through the timing engine, after one warm-up call each: at most
    ``reps`` rounds, ended early once every interval decides (the sequential rule from round
    ``PROBE_ROUNDS``). A round calls each variant up to 3 times (fewer when a call is slow); the budget
    is ``budget_s`` or, for slow variants, what ``PROBE_ROUNDS`` rounds need (``probe_budget``)."""

    def synced() -> None:
        sync(device_type)

    warm = [time_block(fn, 1, synced) for fn in variants.values()]
    budget = probe_budget(sum(warm), budget_s)
    calls = max(1, min(3, int(budget / max(1e-9, reps * sum(warm)))))

    def sample(name: str) -> list[float]:
        return time_calls(variants[name], calls, synced)

    names = list(variants)
    base, arms = Arm(names[0]), [Arm(n) for n in names[1:]]
    first_look = min(PROBE_ROUNDS, reps)
    interleave(base, arms, sample, Settings(budget_s=budget, min_rounds=first_look, max_rounds=reps))
    medians = {a.name: statistics.median(v for r in a.rounds for v in r) for a in [base, *arms]}
    return Timed(medians, {a.name: a.interval for a in arms}, budget, budget > budget_s)


def saving(t: Timed, base: str, new: str) -> dict[str, Any]:
    """base_s, new_s, saving_s (>0: ``new`` is faster), the rounds' budget and, from the interval, the
    saving's bounds."""
    b, n = t.medians[base], t.medians[new]
    out: dict[str, Any] = {"base_s": b, "new_s": n, "saving_s": b - n}
    if t.budget_s is not None:
        out["budget_s"] = t.budget_s
    if t.scaled:
        out["budget_scaled"] = True
    iv = t.intervals.get(new)
    if iv is not None:
        out["rounds"] = iv.rounds
    if iv is not None and iv.rounds >= 2:
        # speed-up S = base/new, so new = base/S and the saving base - base/S grows with S
        out["saving_lo_s"] = b - b / iv.lo if iv.lo > 0 else None
        out["saving_hi_s"] = b - b / iv.hi if math.isfinite(iv.hi) else None
        out["interval"] = iv.to_dict()
        out["interval_text"] = iv.text()
    return out


def as_script(dev: str, facts: dict[str, Any]) -> contextlib.AbstractContextManager[Any]:
    """The autocast the script's forward ran under, if any (``pitstop.recipes.autocast.as_ran``)."""
    return autocast.as_ran(dev, facts)
