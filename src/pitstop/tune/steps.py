"""What the batch-size finder and the LR range test share: a default loss, one training
step, and saving/restoring model + optimizer state so a search leaves the user's objects as it found them.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pitstop.train.trainer import ComputeLoss  # (model, batch) -> scalar loss tensor


def default_loss(model: Any, batch: Any) -> Any:
    """A stand-in when the user gives no loss: cross-entropy for integer targets, MSE for float targets,
    the model's own ``.loss`` for dict batches (Hugging Face style), mean square of the output otherwise."""
    import torch
    import torch.nn.functional as F

    if isinstance(batch, dict):
        out = model(**batch)
        loss = getattr(out, "loss", None)
        if loss is None and isinstance(out, dict):
            loss = out.get("loss")
        if loss is None:
            raise ValueError("the model's output has no .loss; pass a loss function (--loss pkg.mod:fn)")
        return loss
    if isinstance(batch, list | tuple) and len(batch) >= 2 and isinstance(batch[1], torch.Tensor):
        x, y = batch[0], batch[1]
        out = model(x)
        if not y.is_floating_point():
            if out.dim() > 2:  # (N, T, C) token logits
                return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
            return F.cross_entropy(out, y)
        return F.mse_loss(out, y.to(out.dtype).reshape(out.shape))
    x = batch[0] if isinstance(batch, list | tuple) else batch
    return model(x).float().pow(2).mean()


def train_step(model: Any, optimizer: Any, batch: Any, loss_fn: ComputeLoss) -> Any:
    """Forward, backward and the optimizer's step (with a closure that repeats them, where the optimizer
    requires one: LBFGS)."""
    from pitstop.train.optim import step

    def closure() -> Any:
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model, batch)
        loss.backward()
        return loss

    loss = closure()
    step(optimizer, closure)
    return loss


def to_cpu_copy(obj: Any) -> Any:
    """A deep copy with every tensor on the CPU (a search must not hold a second copy in GPU memory)."""
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return type(obj)((k, to_cpu_copy(v)) for k, v in obj.items())
    if isinstance(obj, list | tuple):
        return type(obj)(to_cpu_copy(v) for v in obj)
    return copy.deepcopy(obj)


class SavedState:
    """Copies (on the CPU) of model and optimizer state and the RNG, restored on ``restore()``.

    ``load_state_dict`` copies the values back into the existing parameters and moves optimizer state to
    each parameter's device, so nothing is re-allocated on the user's side."""

    def __init__(self, model: Any, optimizer: Any | None) -> None:
        import torch

        self.model, self.optimizer = model, optimizer
        self.model_state = to_cpu_copy(model.state_dict())
        self.opt_state = to_cpu_copy(optimizer.state_dict()) if optimizer is not None else None
        self.training = model.training
        self.rng = torch.get_rng_state()
        self.cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None

    def restore(self) -> None:
        import torch

        self.model.load_state_dict(self.model_state)
        if self.optimizer is not None and self.opt_state is not None:
            self.optimizer.zero_grad(set_to_none=True)
            self.optimizer.load_state_dict(self.opt_state)
            if not self.opt_state.get("state"):
                self.optimizer.state.clear()
        self.model.train(self.training)
        torch.set_rng_state(self.rng)
        if self.cuda_rng is not None:
            torch.cuda.set_rng_state_all(self.cuda_rng)


def model_device(model: Any) -> Any:
    import torch

    for p in model.parameters():
        return p.device
    return torch.device("cpu")
