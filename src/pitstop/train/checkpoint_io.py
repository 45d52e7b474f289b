"""Checkpoints that survive a crash and resume exactly.

Written atomically: to ``<path>.tmp``, flushed and fsync'ed, then ``os.replace``d over ``<path>`` and
the directory fsync'ed; a kill at any moment leaves either the previous checkpoint or the new one,
never a torn file. Loaded with ``weights_only=True`` (no arbitrary code from a checkpoint file), so
everything stored is tensors and plain Python values — RNG states included.
"""

from __future__ import annotations

import io
import os
import random
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

# Test-only: when set to a writable path (a FIFO, or /dev/stdout of a child process the test reads), a
# save stops half-way through writing the temp file, writes "mid-save" there and waits to be killed, so
# a test can SIGKILL the process deterministically in the middle of a save.
PAUSE_ENV = "PITSTOP_TEST_CKPT_PAUSE_FIFO"


def capture_rng_state() -> dict[str, Any]:
    """Python, NumPy, torch CPU and every CUDA device's generator state, as weights_only-loadable values."""
    mt_name, mt_keys, mt_pos, has_gauss, gauss = np.random.get_state()  # type: ignore[misc]
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": (
            str(mt_name),
            torch.from_numpy(np.asarray(mt_keys, dtype=np.int64)),
            int(mt_pos),
            int(has_gauss),
            float(gauss),
        ),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    random.setstate(_tuplify(state["python"]))
    name, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _tuplify(x: Any) -> Any:
    # random.setstate needs tuples; a round trip through some serializers turns them into lists.
    return tuple(_tuplify(v) for v in x) if isinstance(x, (list, tuple)) else x


def atomic_save(obj: Any, path: str | os.PathLike[str]) -> Path:
    """``torch.save(obj)`` to ``path`` atomically (temp file + fsync + rename + directory fsync)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    pause_fifo = os.environ.get(PAUSE_ENV)
    with open(tmp, "wb") as fh:
        if pause_fifo:
            _save_and_pause(obj, fh, pause_fifo)
        else:
            torch.save(obj, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)
    return path


def _save_and_pause(obj: Any, fh: Any, fifo: str) -> None:
    buf = io.BytesIO()
    torch.save(obj, buf)
    data = buf.getvalue()
    fh.write(data[: len(data) // 2])
    fh.flush()
    os.fsync(fh.fileno())
    with open(fifo, "w") as f:  # blocks until the test opens the FIFO for reading
        f.write("mid-save\n")
    threading.Event().wait()  # until SIGKILL


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some filesystems refuse fsync on directories; the rename is still atomic
        pass
    finally:
        os.close(fd)


@dataclass
class TrainState:
    """Where training stands: optimizer steps done, epoch, micro-batches consumed in that epoch.

    ``epoch_rng`` is the RNG state at the start of the epoch (replayed so the loader draws the same
    shuffle); ``rng`` the state at the moment of saving, per rank.
    """

    step: int = 0
    epoch: int = 0
    batches_in_epoch: int = 0
    epoch_rng: list[dict[str, Any]] | None = None
    rng: list[dict[str, Any]] | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def is_fsdp(model: torch.nn.Module) -> bool:
    """Whether ``model`` was sharded with FSDP2 ``fully_shard`` (its state is DTensors across ranks)."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:
        return False
    return isinstance(model, FSDPModule)


def _full_state(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer | None
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    if not is_fsdp(model):
        return model.state_dict(), optimizer.state_dict() if optimizer is not None else None
    # FSDP2: gather full, unsharded tensors to CPU (a collective: every rank calls it; rank 0 gets them).
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    msd, osd = get_state_dict(model, [optimizer] if optimizer is not None else [], options=opts)
    return msd, (osd if optimizer is not None else None)


def save_checkpoint(
    path: str | os.PathLike[str],
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any = None,
    scaler: torch.amp.GradScaler | None = None,
    state: TrainState | None = None,
    write: bool = True,
) -> Path:
    """Save model, optimizer, scheduler, scaler, step/epoch and RNG states atomically to ``path``.

    ``model`` should be the plain model (``pitstop.train.compile.unwrap`` removes compile/DDP wrappers).
    When ``state.rng`` is None the calling process's RNG state is captured. For an FSDP2 model every
    rank must call this (the full state is gathered collectively) with ``write=True`` only on rank 0;
    the file then holds plain full tensors, loadable by any world size.
    """
    st = state or TrainState()
    model_sd, optim_sd = _full_state(model, optimizer)
    path = Path(path)
    if not write:
        return path
    payload: dict[str, Any] = {
        "version": 1,
        "model": model_sd,
        "optimizer": optim_sd,
        "scheduler": scheduler.state_dict() if scheduler is not None else None,
        "scaler": scaler.state_dict() if scaler is not None else None,
        "step": st.step,
        "epoch": st.epoch,
        "batches_in_epoch": st.batches_in_epoch,
        "epoch_rng": st.epoch_rng,
        "rng": st.rng if st.rng is not None else [capture_rng_state()],
        "extra": st.extra,
    }
    return atomic_save(payload, path)


def load_checkpoint(
    path: str | os.PathLike[str],
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any = None,
    scaler: torch.amp.GradScaler | None = None,
    map_location: str | torch.device = "cpu",
) -> TrainState:
    """Load what ``save_checkpoint`` wrote into the given objects (``weights_only=True``); return the state.

    RNG states are returned, not applied: the caller restores them at the right moment
    (``fit`` replays the epoch's shuffle first). Use ``restore_rng_state(state.rng[rank])`` by hand.
    """
    payload = torch.load(path, map_location=map_location, weights_only=True)
    if is_fsdp(model):  # every rank loads the full state and keeps its own shard
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

        optim_sd = payload.get("optimizer") if optimizer is not None else None
        set_state_dict(
            model,
            [optimizer] if optim_sd is not None else [],
            model_state_dict=payload["model"],
            optim_state_dict=optim_sd or {},
            options=StateDictOptions(full_state_dict=True),
        )
    else:
        model.load_state_dict(payload["model"])
        if optimizer is not None and payload.get("optimizer") is not None:
            optimizer.load_state_dict(payload["optimizer"])
    if scheduler is not None and payload.get("scheduler") is not None:
        scheduler.load_state_dict(payload["scheduler"])
    if scaler is not None and payload.get("scaler") is not None:
        scaler.load_state_dict(payload["scaler"])
    return TrainState(
        step=int(payload["step"]),
        epoch=int(payload["epoch"]),
        batches_in_epoch=int(payload.get("batches_in_epoch", 0)),
        epoch_rng=payload.get("epoch_rng"),
        rng=payload.get("rng"),
        extra=dict(payload.get("extra") or {}),
    )
