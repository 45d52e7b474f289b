"""Data parallel training under torchrun (``pitstop launch`` or plain ``torchrun``): DDP, or FSDP2.

One process per device; torchrun sets RANK/LOCAL_RANK/WORLD_SIZE and the rendezvous. NCCL on GPU,
gloo on CPU. Without those variables everything here is a single-process no-op, so the same script
runs with ``python train.py`` and ``torchrun --nproc-per-node N train.py``.
"""

from __future__ import annotations

import atexit
import gc
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistEnv:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """Rank 0: the one process that logs, shows progress and writes checkpoints."""
        return self.rank == 0


def env_from_environ(environ: dict[str, str] | None = None) -> tuple[int, int, int]:
    """(rank, local_rank, world_size) from torchrun's variables; (0, 0, 1) outside torchrun."""
    e = os.environ if environ is None else environ
    return int(e.get("RANK", 0)), int(e.get("LOCAL_RANK", 0)), int(e.get("WORLD_SIZE", 1))


def resolve_device(name: torch.device | str | None = None) -> torch.device:
    """``name`` as a torch.device; None, "" or "auto": CUDA when torch sees a GPU, else CPU."""
    if name is None or name in ("", "auto"):
        return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    return torch.device(name)


def init_distributed(device: torch.device | str | None = None, backend: str | None = None) -> DistEnv:
    """Join the torchrun process group if launched by torchrun; pick this rank's device.

    CUDA: device ``cuda:LOCAL_RANK`` and NCCL; CPU: gloo. Idempotent (an existing group is reused). A
    group created here is destroyed at interpreter exit unless ``cleanup()`` ran first.
    """
    rank, local_rank, world = env_from_environ()
    dev = resolve_device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", local_rank)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    if world > 1 and not dist.is_initialized():
        backend = backend or ("nccl" if dev.type == "cuda" else "gloo")
        kwargs: dict[str, Any] = {"backend": backend}
        if dev.type == "cuda":
            kwargs["device_id"] = dev  # binds NCCL to this device at init (no lazy guess from rank)
        dist.init_process_group(**kwargs)
        # Scripts rarely destroy the group; left alive at exit, gloo's threads can abort the process
        # ("terminate called without an active exception") after the work is done. Ours, so ours to close.
        atexit.register(cleanup)
    if dist.is_initialized():
        rank, world = dist.get_rank(), dist.get_world_size()
    return DistEnv(rank=rank, local_rank=local_rank, world_size=world, device=dev)


def cleanup() -> None:
    if dist.is_initialized():
        # models the script no longer reaches but that sit in reference cycles (FSDP2's state and hooks)
        # still hold the group: collected first, the group's threads end here, not at interpreter teardown
        gc.collect()
        dist.destroy_process_group()


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def wrap_ddp(model: torch.nn.Module, env: DistEnv, **ddp_kwargs: Any) -> torch.nn.Module:
    """DistributedDataParallel when running distributed; the model itself otherwise.

    ``gradient_as_bucket_view`` saves one gradient-sized copy; ``static_graph`` is left to the caller.
    """
    if not env.is_distributed:
        return model
    from torch.nn.parallel import DistributedDataParallel as DDP

    ddp_kwargs.setdefault("gradient_as_bucket_view", True)
    if env.device.type == "cuda":
        ddp_kwargs.setdefault("device_ids", [env.device.index])
    return DDP(model, **ddp_kwargs)


def wrap_fsdp(
    model: torch.nn.Module,
    env: DistEnv,
    shard: Iterable[type[torch.nn.Module]] = (),
    mixed_precision: torch.dtype | None = None,
) -> torch.nn.Module:
    """FSDP2 (``fully_shard``): shard each submodule of the given types, then the root.

    For models that do not fit one device: parameters, gradients and optimizer state are split across
    ranks and gathered per block. ``mixed_precision`` sets the parameter dtype for compute (reductions
    stay fp32). Build the optimizer after wrapping. A single process gets the model back unchanged.
    """
    if not env.is_distributed:
        return model
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    kwargs: dict[str, Any] = {}
    if mixed_precision is not None:
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=mixed_precision, reduce_dtype=torch.float32)
    types = tuple(shard)
    if types:
        for m in list(model.modules())[1:]:
            if isinstance(m, types):
                fully_shard(m, **kwargs)
    fully_shard(model, **kwargs)
    return model


def distributed_sampler(
    dataset: Any, env: DistEnv, shuffle: bool = True, seed: int = 0, drop_last: bool = False
) -> torch.utils.data.Sampler | None:
    """A DistributedSampler giving each rank its 1/world share, or None when single-process.

    Call ``sampler.set_epoch(epoch)`` every epoch (``fit`` does) or every epoch reuses one shuffle.
    """
    if not env.is_distributed:
        return None
    from torch.utils.data.distributed import DistributedSampler

    return DistributedSampler(
        dataset, num_replicas=env.world_size, rank=env.rank, shuffle=shuffle, seed=seed, drop_last=drop_last
    )


def set_epoch(loader: Any, epoch: int) -> bool:
    """Tell a loader's DistributedSampler which epoch it is (through a DevicePrefetcher too).

    Returns whether a sampler took it; loaders without an epoch-aware sampler are left alone.
    """
    inner = getattr(loader, "loader", None)
    if inner is not None:
        return set_epoch(inner, epoch)
    batch_sampler = getattr(loader, "batch_sampler", None)
    for sampler in (getattr(loader, "sampler", None), getattr(batch_sampler, "sampler", None)):
        if sampler is not None and hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)
            return True
    return False


def all_reduce_mean(t: torch.Tensor) -> torch.Tensor:
    """Mean of ``t`` over ranks (in place); unchanged when single-process."""
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        t /= dist.get_world_size()
    return t
