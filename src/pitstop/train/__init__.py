"""pitstop.train: a lean training loop with the fast path by default, and its recipes one by one.

Common case::

    from pitstop.train import TrainConfig, fit
    result = fit(model, None, train_loader, torch.nn.functional.cross_entropy, TrainConfig(epochs=3))

Each recipe also works in a hand-written loop: ``Amp`` (autocast + scaler + clipping), ``accumulate``
and ``sync_context`` (gradient accumulation with DDP ``no_sync``), ``no_sync_every`` (the same for an
unchanged loop), ``apply_activation_checkpointing``,
``to_channels_last``/``channels_last_input`` (the channels_last component's, ``pitstop.recipes.channels_last``),
``maybe_compile``, ``make_optimizer`` (fused),
``one_cycle``/``cyclic``, ``DevicePrefetcher``, ``init_distributed``/``wrap_ddp``/``wrap_fsdp``,
``save_checkpoint``/``load_checkpoint`` (atomic, exact resume), ``RunningMean`` (no per-step syncs).
Names load on first use (PEP 562), so ``from pitstop.train import keep_host_memory`` at the top of a
script, or a tool that needs only the host-memory recipe, does not import torch; the rest imports torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # for type checkers and IDEs; at run time __getattr__ imports on first use
    # ruff: noqa: F401
    from pitstop.recipes.activation_checkpointing import (
        apply_activation_checkpointing,
        remove_activation_checkpointing,
    )
    from pitstop.recipes.channels_last import apply_input as channels_last_input
    from pitstop.recipes.channels_last import apply_model as to_channels_last
    from pitstop.recipes.channels_last import has_conv2d
    from pitstop.recipes.host_memory import HostMemory, keep_host_memory
    from pitstop.recipes.step import (
        accumulate,
        no_sync_every,
        optimizer_steps_per_epoch,
        scale_loss,
        sync_context,
    )
    from pitstop.train.amp import Amp, autocast, clip_gradients, make_grad_scaler, resolve_precision
    from pitstop.train.backends import configure_backends
    from pitstop.train.checkpoint_io import (
        TrainState,
        atomic_save,
        capture_rng_state,
        load_checkpoint,
        restore_rng_state,
        save_checkpoint,
    )
    from pitstop.train.compile import maybe_compile, unwrap
    from pitstop.train.config import FitResult, TrainConfig
    from pitstop.train.distributed import (
        DistEnv,
        all_reduce_mean,
        cleanup,
        distributed_sampler,
        init_distributed,
        set_epoch,
        wrap_ddp,
        wrap_fsdp,
    )
    from pitstop.train.evaluation import evaluate
    from pitstop.train.memory import (
        TensorMemoryTracker,
        activation_memory_saving,
        measure_step_memory,
        peak_memory_bytes,
    )
    from pitstop.train.metrics import RunningMean, batch_size
    from pitstop.train.optim import make_optimizer, param_groups
    from pitstop.train.prefetch import DevicePrefetcher, move_to
    from pitstop.train.progress import TrainProgress, nvtx_range
    from pitstop.train.schedules import cyclic, one_cycle, total_steps
    from pitstop.train.trainer import fit

# public name -> the module that defines it
_WHERE = {
    "accumulate": "pitstop.recipes.step",
    "no_sync_every": "pitstop.recipes.step",
    "optimizer_steps_per_epoch": "pitstop.recipes.step",
    "scale_loss": "pitstop.recipes.step",
    "sync_context": "pitstop.recipes.step",
    "Amp": "pitstop.train.amp",
    "autocast": "pitstop.train.amp",
    "clip_gradients": "pitstop.train.amp",
    "make_grad_scaler": "pitstop.train.amp",
    "resolve_precision": "pitstop.train.amp",
    "configure_backends": "pitstop.train.backends",
    "activation_memory_saving": "pitstop.train.memory",
    "apply_activation_checkpointing": "pitstop.recipes.activation_checkpointing",
    "measure_step_memory": "pitstop.train.memory",
    "remove_activation_checkpointing": "pitstop.recipes.activation_checkpointing",
    "TrainState": "pitstop.train.checkpoint_io",
    "atomic_save": "pitstop.train.checkpoint_io",
    "capture_rng_state": "pitstop.train.checkpoint_io",
    "load_checkpoint": "pitstop.train.checkpoint_io",
    "restore_rng_state": "pitstop.train.checkpoint_io",
    "save_checkpoint": "pitstop.train.checkpoint_io",
    "maybe_compile": "pitstop.train.compile",
    "unwrap": "pitstop.train.compile",
    "DistEnv": "pitstop.train.distributed",
    "all_reduce_mean": "pitstop.train.distributed",
    "cleanup": "pitstop.train.distributed",
    "distributed_sampler": "pitstop.train.distributed",
    "init_distributed": "pitstop.train.distributed",
    "set_epoch": "pitstop.train.distributed",
    "wrap_ddp": "pitstop.train.distributed",
    "wrap_fsdp": "pitstop.train.distributed",
    "HostMemory": "pitstop.recipes.host_memory",
    "keep_host_memory": "pitstop.recipes.host_memory",
    "TensorMemoryTracker": "pitstop.train.memory",
    "peak_memory_bytes": "pitstop.train.memory",
    "channels_last_input": "pitstop.recipes.channels_last",
    "has_conv2d": "pitstop.recipes.channels_last",
    "to_channels_last": "pitstop.recipes.channels_last",
    "RunningMean": "pitstop.train.metrics",
    "batch_size": "pitstop.train.metrics",
    "make_optimizer": "pitstop.train.optim",
    "param_groups": "pitstop.train.optim",
    "DevicePrefetcher": "pitstop.train.prefetch",
    "move_to": "pitstop.train.prefetch",
    "TrainProgress": "pitstop.train.progress",
    "nvtx_range": "pitstop.train.progress",
    "cyclic": "pitstop.train.schedules",
    "one_cycle": "pitstop.train.schedules",
    "total_steps": "pitstop.train.schedules",
    "FitResult": "pitstop.train.config",
    "TrainConfig": "pitstop.train.config",
    "evaluate": "pitstop.train.evaluation",
    "fit": "pitstop.train.trainer",
}
# public names that their module calls otherwise: the channels_last component's parts
_RENAMED = {"channels_last_input": "apply_input", "to_channels_last": "apply_model"}
__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name]), _RENAMED.get(name, name))
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))
