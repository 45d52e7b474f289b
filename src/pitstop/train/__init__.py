"""pitstop.train: a lean training loop with the fast path by default, and its recipes one by one.

Common case::

    from pitstop.train import TrainConfig, fit
    result = fit(model, None, train_loader, torch.nn.functional.cross_entropy, TrainConfig(epochs=3))

Each recipe also works in a hand-written loop: ``Amp`` (autocast + scaler + clipping), ``accumulate``
and ``sync_context`` (gradient accumulation with DDP ``no_sync``), ``apply_activation_checkpointing``,
``to_channels_last``/``channels_last_input``, ``maybe_compile``, ``make_optimizer`` (fused),
``one_cycle``/``cyclic``, ``DevicePrefetcher``, ``init_distributed``/``wrap_ddp``/``wrap_fsdp``,
``save_checkpoint``/``load_checkpoint`` (atomic, exact resume), ``RunningMean`` (no per-step syncs).
Importing this package imports torch.
"""

from pitstop.host_memory import HostMemory, keep_host_memory
from pitstop.train.accumulation import accumulate, optimizer_steps_per_epoch, scale_loss, sync_context
from pitstop.train.amp import Amp, autocast, clip_gradients, make_grad_scaler, resolve_precision
from pitstop.train.backends import configure_backends
from pitstop.train.checkpointing import (
    activation_memory_saving,
    apply_activation_checkpointing,
    measure_step_memory,
    remove_activation_checkpointing,
)
from pitstop.train.ckpt import (
    TrainState,
    atomic_save,
    capture_rng_state,
    load_checkpoint,
    restore_rng_state,
    save_checkpoint,
)
from pitstop.train.compile import maybe_compile, unwrap
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
from pitstop.train.memory import TensorMemoryTracker, peak_memory_bytes
from pitstop.train.memory_format import channels_last_input, has_conv2d, to_channels_last
from pitstop.train.metrics import RunningMean, batch_size
from pitstop.train.optim import make_optimizer, param_groups
from pitstop.train.prefetch import DevicePrefetcher, move_to
from pitstop.train.progress import TrainProgress, nvtx_range
from pitstop.train.schedules import cyclic, one_cycle, total_steps
from pitstop.train.trainer import FitResult, TrainConfig, evaluate, fit

__all__ = [
    "Amp",
    "DevicePrefetcher",
    "DistEnv",
    "FitResult",
    "HostMemory",
    "RunningMean",
    "TensorMemoryTracker",
    "TrainConfig",
    "TrainProgress",
    "TrainState",
    "accumulate",
    "activation_memory_saving",
    "all_reduce_mean",
    "apply_activation_checkpointing",
    "atomic_save",
    "autocast",
    "batch_size",
    "capture_rng_state",
    "channels_last_input",
    "cleanup",
    "clip_gradients",
    "configure_backends",
    "cyclic",
    "distributed_sampler",
    "evaluate",
    "fit",
    "has_conv2d",
    "init_distributed",
    "keep_host_memory",
    "load_checkpoint",
    "make_grad_scaler",
    "make_optimizer",
    "maybe_compile",
    "measure_step_memory",
    "move_to",
    "nvtx_range",
    "one_cycle",
    "optimizer_steps_per_epoch",
    "param_groups",
    "peak_memory_bytes",
    "remove_activation_checkpointing",
    "resolve_precision",
    "restore_rng_state",
    "save_checkpoint",
    "scale_loss",
    "set_epoch",
    "sync_context",
    "to_channels_last",
    "total_steps",
    "unwrap",
    "wrap_ddp",
    "wrap_fsdp",
]
