"""Mixed precision: pick the dtype, autocast the forward, scale (fp16) and clip the backward.

bf16 autocast runs on CPU (oneDNN, fast with AVX512_BF16/AMX) and on Ampere+ GPUs without a scaler;
fp16 needs ``torch.amp.GradScaler`` because its range underflows small gradients. ``auto`` asks
``pitstop.host.precision.preferred_amp_dtype`` what this machine is fast at and, where the CPU's flags say
bf16, confirms it with a bounded bf16-vs-fp32 torch.mm measurement (``pitstop.matmul.cpu_bf16_check``,
once per process): the flags say what the CPU has, not what oneDNN runs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch

from pitstop import matmul
from pitstop.host.precision import device_type
from pitstop.recipes import autocast as amp_recipe

PRECISIONS = ("auto", "bf16", "fp16", "fp32")
_NAMES = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16}


def resolve_precision(precision: str, device: torch.device | str) -> torch.dtype | None:
    """The autocast dtype for ``precision`` ('auto', 'bf16', 'fp16', 'fp32') on ``device``; None = fp32.
    ``auto`` on a CPU: bf16 where its flags name bf16 hardware and bf16 torch.mm measured no slower than
    fp32 here; a CPU without the flags stays fp32 without running a matmul.

    fp16 is only honoured on CUDA (CPU fp16 autocast is slow and has no scaler support here), so asking
    for it on CPU raises instead of silently training in something else.
    """
    p = precision.lower()
    if p not in PRECISIONS and p not in _NAMES:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    dev = device_type(device)
    if p == "auto":
        name = matmul.fast_amp_dtype(dev)
        return _NAMES[name] if name else None
    if p == "fp32":
        return None
    dtype = _NAMES[p]
    if dtype is torch.float16 and dev != "cuda":
        raise ValueError("fp16 autocast needs a CUDA device; use bf16 or fp32 on CPU")
    return dtype


def autocast(device: torch.device | str, dtype: torch.dtype | None) -> contextlib.AbstractContextManager:
    """``torch.autocast`` for the forward pass and loss, or a no-op for fp32 (``pitstop.recipes.autocast``)."""
    return amp_recipe.context(device_type(device), dtype)


def make_grad_scaler(device: torch.device | str, dtype: torch.dtype | None) -> torch.amp.GradScaler | None:
    """A GradScaler only where it is needed: fp16 on CUDA. bf16 has fp32's range and needs none."""
    if dtype is torch.float16 and device_type(device) == "cuda":
        return torch.amp.GradScaler("cuda")
    return None


@dataclass
class Amp:
    """Everything mixed precision needs in one object: ``with amp.autocast(): ...``; ``amp.step(loss, opt)``."""

    device: torch.device
    dtype: torch.dtype | None
    scaler: torch.amp.GradScaler | None

    @classmethod
    def create(cls, precision: str = "auto", device: torch.device | str = "cpu") -> Amp:
        dtype = resolve_precision(precision, device)
        return cls(torch.device(device), dtype, make_grad_scaler(device, dtype))

    @property
    def name(self) -> str:
        return {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(self.dtype, "fp32")  # type: ignore[arg-type]

    def autocast(self) -> contextlib.AbstractContextManager:
        return autocast(self.device, self.dtype)

    def backward(self, loss: torch.Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    def step(
        self,
        optimizer: torch.optim.Optimizer,
        clip_norm: float | None = None,
        parameters: Iterable[torch.nn.Parameter] | None = None,
    ) -> torch.Tensor | None:
        """Unscale (fp16), clip, step, update the scale, zero grads. Returns the pre-clip grad norm if clipped.

        The norm stays a device tensor: reading it would be a host sync every step.
        """
        norm = clip_gradients(optimizer, clip_norm, self.scaler, parameters)
        if self.scaler is not None:
            self.scaler.step(optimizer)
            self.scaler.update()
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return norm


def clip_gradients(
    optimizer: torch.optim.Optimizer,
    max_norm: float | None,
    scaler: torch.amp.GradScaler | None = None,
    parameters: Iterable[torch.nn.Parameter] | None = None,
) -> torch.Tensor | None:
    """Clip the global grad norm to ``max_norm`` after unscaling, so the threshold is in true units.

    Without unscaling first, an fp16 run would clip against gradients multiplied by the loss scale
    (65536 at start) and effectively zero every update.
    """
    if max_norm is None:
        return None
    if scaler is not None:
        scaler.unscale_(optimizer)
    params = list(parameters) if parameters is not None else list(_optimizer_params(optimizer))
    return torch.nn.utils.clip_grad_norm_(params, max_norm)


def _optimizer_params(optimizer: torch.optim.Optimizer) -> Iterator[torch.nn.Parameter]:
    for group in optimizer.param_groups:
        yield from group["params"]
