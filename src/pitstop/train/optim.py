"""Optimizer setup on the fast path: fused kernels where the device has them, foreach otherwise.

``fused=True`` runs Adam/AdamW/SGD as one kernel over all parameters (CUDA, and CPU in recent torch);
``foreach`` batches the per-parameter ops. Weight decay is not applied to biases and norm weights.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable

import torch

from pitstop.recipes import optimizer_impl

OPTIMIZERS = {"adamw": torch.optim.AdamW, "adam": torch.optim.Adam, "sgd": torch.optim.SGD}


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Two groups: decayed matrices/conv kernels, and undecayed 1-d parameters (biases, norm scales).

    Without weight decay, one group: each group is a separate (fused) optimizer kernel launch.
    """
    if not weight_decay:
        return [{"params": [p for p in model.parameters() if p.requires_grad], "weight_decay": 0.0}]
    decay, no_decay = [], []
    for p in model.parameters():
        if p.requires_grad:
            (decay if p.dim() >= 2 else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}]
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    return groups


def fused_supported(cls: type[torch.optim.Optimizer], device: torch.device | str) -> bool:
    """Whether ``cls`` accepts ``fused=True`` for parameters on ``device`` in this torch build."""
    if "fused" not in inspect.signature(cls.__init__).parameters:
        return False
    dev = torch.device(device).type
    try:
        from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

        return dev in _get_fused_kernels_supported_devices()
    except ImportError:
        return dev == "cuda"


def make_optimizer(
    model: torch.nn.Module | Iterable[torch.nn.Parameter],
    name: str = "adamw",
    lr: float = 1e-3,
    weight_decay: float = 0.0,
    fused: bool | None = None,
    **kwargs: object,
) -> torch.optim.Optimizer:
    """An optimizer with ``fused`` when supported (``fused=None`` = auto), else ``foreach``.

    ``model`` may be a module (then biases/norms get no weight decay) or an iterable of parameters.
    """
    try:
        cls = OPTIMIZERS[name.lower()]
    except KeyError:
        raise ValueError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, got {name!r}") from None
    if isinstance(model, torch.nn.Module):
        params: list = param_groups(model, weight_decay)
        first = next(model.parameters(), None)
    else:
        params = [p for p in model if p.requires_grad]
        kwargs["weight_decay"] = weight_decay
        first = params[0] if params else None
    device = first.device if first is not None else torch.device("cpu")
    if fused is None:
        fused = fused_supported(cls, device)
    kwargs.update(optimizer_impl.kwargs(bool(fused)))
    return cls(params, lr=lr, **kwargs)


def needs_closure(opt: torch.optim.Optimizer) -> bool:
    """Whether ``opt.step()`` requires a closure (LBFGS: it re-evaluates the loss itself)."""
    try:
        param = inspect.signature(type(opt).step).parameters.get("closure")
    except (TypeError, ValueError):
        return False
    return param is not None and param.default is inspect.Parameter.empty


def step(opt: torch.optim.Optimizer, closure: Callable[[], torch.Tensor]) -> None:
    """One ``opt.step()``, given ``closure`` (zero the gradients, forward, backward, return the loss)
    where the optimizer requires one; the caller has run forward and backward already otherwise."""
    if needs_closure(opt):
        opt.step(closure)
    else:
        opt.step()


def impl_of(optimizer: torch.optim.Optimizer | None, device: torch.device | str) -> str | None:
    """``Knobs.optimizer_impl`` of ``optimizer``: "fused" / "foreach" as its defaults set, None where they
    set neither; for None, that of the AdamW ``make_optimizer`` builds on ``device``."""
    if optimizer is None:
        return "fused" if fused_supported(torch.optim.AdamW, device) else "foreach"
    d = optimizer.defaults
    return "fused" if d.get("fused") else "foreach" if d.get("foreach") else None
