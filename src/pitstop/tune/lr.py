"""Learning-rate range test (Smith, "Cyclical Learning Rates", 2017): train for a few steps while the LR
grows exponentially from ``start_lr`` to ``end_lr``, track the loss smoothed by a bias-corrected
exponential average, stop when it diverges, and suggest bounds for OneCycleLR / CyclicLR.

Suggestion rule (documented in docs/tune.md): OneCycleLR ``max_lr`` = the LR at the smoothed-loss minimum
divided by 10 (one order of magnitude before the loss turns, the fast.ai reading of Smith); CyclicLR
``base_lr`` = max_lr / 4 (Smith: 3-4x below the maximum). The steepest-descent LR is reported next to it.
Model, optimizer and RNG state are restored afterwards.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from pitstop.findings import Finding, Severity
from pitstop.tune.steps import SavedState, default_loss, model_device, train_step

if TYPE_CHECKING:
    from pitstop.train.trainer import ComputeLoss


@dataclass
class LRResult:
    lrs: list[float] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)  # raw loss of each step
    smoothed: list[float] = field(default_factory=list)  # bias-corrected exponential moving average
    stop: str = "completed"  # completed | diverged | non-finite | data exhausted | interrupted
    min_loss_lr: float | None = None
    steepest_lr: float | None = None
    suggested_max_lr: float | None = None  # OneCycleLR max_lr
    cyclic_base_lr: float | None = None
    cyclic_max_lr: float | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    error: str | None = None  # the exception that ended the test (loss function, batch format ...)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["losses"] = [v if math.isfinite(v) else None for v in self.losses]
        d["smoothed"] = [v if math.isfinite(v) else None for v in self.smoothed]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LRResult:
        d = dict(d)
        d["losses"] = [math.nan if v is None else v for v in d.get("losses", [])]
        d["smoothed"] = [math.nan if v is None else v for v in d.get("smoothed", [])]
        return cls(**d)


def lr_schedule(start_lr: float, end_lr: float, num_steps: int) -> list[float]:
    if num_steps < 2:
        return [start_lr]
    ratio = end_lr / start_lr
    return [start_lr * ratio ** (i / (num_steps - 1)) for i in range(num_steps)]


def suggest(
    lrs: list[float], smoothed: list[float], skip_start: int = 3, first_loss: float | None = None
) -> dict[str, float | None]:
    """Min-loss LR, steepest-descent LR (on log10 lr) and the OneCycle/Cyclic bounds derived from them.

    No bounds when the test found no descent: the smoothed minimum lies in the first ``skip_start``
    steps or is not below ``first_loss`` (the first logged loss), so the loss never fell as the LR grew."""
    pts = [(lr, s) for lr, s in zip(lrs, smoothed, strict=False) if math.isfinite(s)]
    out: dict[str, float | None] = dict.fromkeys(
        ("min_loss_lr", "steepest_lr", "suggested_max_lr", "cyclic_base_lr", "cyclic_max_lr")
    )
    if len(pts) < 3:
        return out
    i_min = min(range(len(pts)), key=lambda i: pts[i][1])
    out["min_loss_lr"] = pts[i_min][0]
    first = pts[0][1] if first_loss is None or not math.isfinite(first_loss) else first_loss
    if i_min < skip_start or pts[i_min][1] >= first:
        return out
    lo = min(skip_start, max(0, i_min - 1))
    grads = [
        ((pts[i + 1][1] - pts[i][1]) / (math.log10(pts[i + 1][0]) - math.log10(pts[i][0])), i)
        for i in range(lo, max(lo, i_min))
    ]
    if grads:
        g, i = min(grads)
        if g < 0:
            out["steepest_lr"] = pts[i][0]
    max_lr = pts[i_min][0] / 10
    out["suggested_max_lr"] = max_lr
    out["cyclic_max_lr"] = max_lr
    out["cyclic_base_lr"] = max_lr / 4
    return out


def _cycle(loader: Iterable[Any]) -> Any:
    while True:
        empty = True
        for b in loader:
            empty = False
            yield b
        if empty:
            return


def lr_range_test(
    model: Any,
    loader: Iterable[Any],
    optimizer: Any,
    loss_fn: ComputeLoss | None = None,
    *,
    start_lr: float = 1e-7,
    end_lr: float = 10.0,
    num_steps: int = 100,
    beta: float = 0.98,
    diverge: float = 4.0,
    progress: Callable[[int, int], None] | None = None,
) -> LRResult:
    """Run the range test on ``model`` with ``optimizer`` over batches from ``loader`` (cycled if short).

    Stops early when the smoothed loss exceeds ``diverge`` x its minimum or a loss is not finite.
    ``model`` and ``optimizer`` are restored to their state before the test, even on Ctrl-C or error.
    """
    if not (0 < start_lr < end_lr):
        raise ValueError(f"need 0 < start_lr < end_lr, got {start_lr} and {end_lr}")
    from pitstop.train.prefetch import move_to

    loss_fn = loss_fn or default_loss
    device = model_device(model)
    saved = SavedState(model, optimizer)
    res = LRResult(
        settings={
            "start_lr": start_lr,
            "end_lr": end_lr,
            "num_steps": num_steps,
            "beta": beta,
            "diverge": diverge,
        }
    )
    avg, best = 0.0, math.inf
    batches = _cycle(loader)
    model.train()
    try:
        for i, lr in enumerate(lr_schedule(start_lr, end_lr, num_steps)):
            for g in optimizer.param_groups:
                g["lr"] = lr
            try:
                batch = next(batches)
            except StopIteration:
                res.stop = "data exhausted"
                break
            loss = float(
                train_step(model, optimizer, move_to(batch, device, non_blocking=True), loss_fn).item()
            )
            res.lrs.append(lr)
            res.losses.append(loss)
            if progress:
                progress(i + 1, num_steps)
            if not math.isfinite(loss):
                res.smoothed.append(math.nan)
                res.stop = "non-finite"
                break
            avg = beta * avg + (1 - beta) * loss
            sm = avg / (1 - beta ** (i + 1))
            res.smoothed.append(sm)
            best = min(best, sm)
            if i > 0 and sm > diverge * best:
                res.stop = "diverged"
                break
    except KeyboardInterrupt:
        res.stop = "interrupted"
    except Exception as e:  # the user's loss/model failed: a finding, with the state still restored
        res.stop = "error"
        lines = str(e).strip().splitlines()
        res.error = f"{type(e).__name__}: {lines[0][:300] if lines else ''}"
    finally:
        saved.restore()
    for k, v in suggest(res.lrs, res.smoothed, first_loss=res.losses[0] if res.losses else None).items():
        setattr(res, k, v)
    return res


def lr_findings(res: LRResult) -> list[Finding]:
    n = len(res.lrs)
    if res.error and res.suggested_max_lr is None:
        return [
            Finding(
                id="tune.lr.error",
                severity=Severity.ERROR,
                title="The LR range test could not run a training step",
                evidence=f"after {n} steps: {res.error}",
                data={"steps": n, "error": res.error},
                fix="Check the batch format and pass a loss function (--loss pkg.mod:fn, fn(model, batch) -> loss).",
            )
        ]
    if res.suggested_max_lr is None and res.min_loss_lr is not None:  # a minimum, but no fall to it
        low = min(v for v in res.smoothed if math.isfinite(v))
        return [
            Finding(
                id="tune.lr.suggestion",
                severity=Severity.WARN,
                title="No descent found: the loss never fell as the LR grew, so no LR is suggested",
                evidence=f"{n} steps from lr {res.lrs[0]:.3g} to {res.lrs[-1]:.3g} ({res.stop}); smoothed "
                f"minimum {low:.4g} at lr {res.min_loss_lr:.3g}, first logged loss {res.losses[0]:.4g}: "
                "the minimum is not a descent from the start",
                data={"steps": n, "stop": res.stop, "min_smoothed": low, "first_loss": res.losses[0]},
                fix="Start lower (--start-lr) so the test sees the loss fall, or check that the model "
                "trains at all (labels, loss function, frozen parameters).",
            )
        ]
    if res.suggested_max_lr is None:
        return [
            Finding(
                id="tune.lr.suggestion",
                severity=Severity.WARN,
                title="LR range test gave no suggestion",
                evidence=f"{n} steps measured, stop: {res.stop}; the smoothed loss never formed a minimum",
                data={"steps": n, "stop": res.stop},
                fix="Widen the range (--start-lr/--end-lr) or run more steps (--steps).",
            )
        ]
    i_min = res.lrs.index(res.min_loss_lr) if res.min_loss_lr in res.lrs else None
    min_txt = f"smoothed loss {res.smoothed[i_min]:.4g}" if i_min is not None else "minimum"
    steep = f"; steepest descent at lr {res.steepest_lr:.3g}" if res.steepest_lr else ""
    code = (
        f"torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr={res.suggested_max_lr:.3g}, total_steps=...)\n"
        f"# or: torch.optim.lr_scheduler.CyclicLR(optimizer, base_lr={res.cyclic_base_lr:.3g}, "
        f"max_lr={res.cyclic_max_lr:.3g})"
    )
    return [
        Finding(
            id="tune.lr.suggestion",
            severity=Severity.INFO,
            title=f"Suggested OneCycleLR max_lr = {res.suggested_max_lr:.3g}",
            evidence=f"{n} steps from lr {res.settings.get('start_lr'):.3g} to {res.lrs[-1]:.3g} ({res.stop}); "
            f"{min_txt} at lr {res.min_loss_lr:.3g}{steep}. max_lr = min-loss lr / 10",
            data={
                "suggested_max_lr": res.suggested_max_lr,
                "min_loss_lr": res.min_loss_lr,
                "steepest_lr": res.steepest_lr,
                "cyclic_base_lr": res.cyclic_base_lr,
                "cyclic_max_lr": res.cyclic_max_lr,
                "stop": res.stop,
                "steps": n,
            },
            fix="Use it as OneCycleLR's max_lr (1cycle schedule), or these CyclicLR bounds.",
            fix_code=code,
        )
    ]
