"""``fit``'s settings and its result: ``TrainConfig`` (every choice ``fit`` makes, and the ``Knobs`` it
resolves to) and ``FitResult`` (what it did and measured).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from pitstop.recipes import model_components
from pitstop.recipes.activation_checkpointing import Target
from pitstop.recipes.knobs import Knobs
from pitstop.train.amp import resolve_precision
from pitstop.train.optim import impl_of

OptimizerLike = torch.optim.Optimizer | Callable[[torch.nn.Module], torch.optim.Optimizer] | None


@dataclass
class TrainConfig:
    """Every choice ``fit`` makes, in one place. Defaults are the fast path for this machine.

    precision: 'auto' (bf16 where the hardware is fast at it, else fp32), 'bf16', 'fp16' (CUDA), 'fp32'.
    channels_last: 'auto' = on for models with Conv2d; True/False to force.
    compile: ``torch.compile`` with eager fallback: True, False, or 'auto' = after the first eager steps,
    compile where it measures faster in a trial and pays back its compilation (CPU; CUDA: where the
    stated rule says the steps left pay) (``pitstop.train.compile_auto``; single process;
    evaluation then runs the model uncompiled: the rule charged one compilation, not a no_grad one).
    schedule: None, 'onecycle' or 'cyclic' (built here, with total steps from loader, epochs and k).
    distributed: 'auto' (DDP when launched by torchrun), 'ddp', 'fsdp' or 'none'.
    keep_host_memory: 'auto' = on for CPU training: glibc keeps freed tensor memory mapped instead of
    page-faulting it back in every step (``pitstop.recipes.host_memory``); True/False to force.
    log_every: optimizer steps between metric reads (the only host syncs in the loop).
    checkpoint_every: optimizer steps between checkpoints to ``checkpoint_path`` (also saved at the end).
    """

    epochs: int = 1
    max_steps: int | None = None
    lr: float = 1e-3
    weight_decay: float = 0.0
    precision: str = "auto"
    accum_steps: int = 1
    clip_grad_norm: float | None = None
    channels_last: bool | str = "auto"
    compile: bool | str = "auto"
    activation_checkpointing: Sequence[Target] = ()
    schedule: str | None = None
    max_lr: float | None = None
    base_lr: float | None = None
    device: str | None = None
    distributed: str = "auto"
    fsdp_shard: Sequence[type[torch.nn.Module]] = ()
    log_every: int = 50
    progress: bool = True
    checkpoint_path: str | None = None
    checkpoint_every: int | None = None
    resume: bool = True
    seed: int | None = None
    nvtx: bool = True
    keep_host_memory: bool | str = "auto"
    tf32: bool = True
    cudnn_benchmark: bool = True

    def knobs(
        self,
        device: torch.device | str,
        model: torch.nn.Module | None = None,
        optimizer: torch.optim.Optimizer | None = None,
    ) -> Knobs:
        """The optimization settings ``fit`` turns on for ``model`` on ``device`` (``Knobs``), each
        ``"auto"`` decided: the precision's autocast dtype, each model component's ``wanted`` (without a
        model, only a forced ``True``), host memory kept on CPU, cuDNN autotuning and TF32 on CUDA (which
        ``prepare_model`` applies). ``compile``: ``compile=True`` only ('auto' is decided in the run).
        ``optimizer_impl``: ``optimizer``'s (``optim.impl_of``), or for None the AdamW ``fit`` builds."""
        dtype = resolve_precision(self.precision, device)
        dev = torch.device(device).type
        on = {
            c.KNOB: c.wanted(getattr(self, c.KNOB), model)
            if model is not None
            else getattr(self, c.KNOB) is True
            for c in model_components()
        }
        keep = dev == "cpu" if self.keep_host_memory == "auto" else bool(self.keep_host_memory)
        return Knobs(
            autocast=str(dtype).replace("torch.", "") if dtype is not None else None,
            compile=self.compile is True,
            cudnn_benchmark=self.cudnn_benchmark and dev == "cuda",
            tf32=self.tf32 and dev == "cuda",
            keep_host_memory=keep,
            optimizer_impl=impl_of(optimizer, device),
            **on,
        )


@dataclass
class FitResult:
    """What ``fit`` did and measured: steps, throughput, the loss history and the settings applied."""

    steps: int
    epochs_completed: int
    samples: int
    elapsed_s: float
    samples_per_s: float
    history: list[dict[str, float]] = field(default_factory=list)
    val: list[dict[str, float]] = field(default_factory=list)
    applied: dict[str, Any] = field(default_factory=dict)
    resumed_from_step: int | None = None
    interrupted: bool = False

    @property
    def final_loss(self) -> float:
        return self.history[-1]["loss"] if self.history else float("nan")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
