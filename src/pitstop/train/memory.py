"""Peak tensor memory of a piece of work, measured: CUDA allocator stats on GPU, tensor tracking on CPU.

The CPU allocator keeps no statistics, so on CPU a ``TorchDispatchMode`` records every storage an op
creates and a weak reference tells when it is freed; the running total's maximum is the peak. It counts
tensor bytes (what activation checkpointing changes), not allocator caching or Python objects.
``measure_step_memory`` and ``activation_memory_saving``: a step's peak, and activation checkpointing's
saving (``pitstop.recipes.activation_checkpointing``), measured so.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakIdKeyDictionary

from pitstop.recipes.activation_checkpointing import (
    Target,
    apply_activation_checkpointing,
    remove_activation_checkpointing,
)


class TensorMemoryTracker(TorchDispatchMode):
    """``with TensorMemoryTracker(model.parameters()) as t: work()`` then ``t.peak_bytes``.

    ``preexisting`` tensors (parameters, inputs) count from the start and are never freed by the work.
    """

    def __init__(self, preexisting: Iterable[torch.Tensor] = ()) -> None:
        super().__init__()
        self._live: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self._refs: dict[int, weakref.ref] = {}
        self.current_bytes = 0
        self.peak_bytes = 0
        for t in preexisting:
            if (st := _storage(t)) is not None:
                self._track(st)
        self.baseline_bytes = self.current_bytes

    def _track(self, st: Any) -> None:
        if st in self._live:
            return
        nbytes = st.nbytes()
        self._live[st] = nbytes
        key = id(st)
        self._refs[key] = weakref.ref(st, lambda _r, k=key, n=nbytes: self._free(k, n))
        self.current_bytes += nbytes
        self.peak_bytes = max(self.peak_bytes, self.current_bytes)

    def _free(self, key: int, nbytes: int) -> None:
        if self._refs.pop(key, None) is not None:
            self.current_bytes -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        # Outputs that share an input's storage (in-place ops, views, out=) allocated nothing: an in-place
        # update of a tensor made before tracking began (a BatchNorm buffer, a parameter) is not new memory.
        inputs = {id(s) for s in map(_storage, tree_flatten((args, kwargs))[0]) if s is not None}
        for t in tree_flatten(out)[0]:
            st = _storage(t)
            if st is not None and id(st) not in inputs:
                self._track(st)
        return out


def _storage(t: Any) -> Any:
    """``t``'s untyped storage, or None for a non-tensor, a meta tensor or a storage-less one."""
    if not isinstance(t, torch.Tensor) or t.device.type == "meta":
        return None
    try:
        return t.untyped_storage()
    except (RuntimeError, NotImplementedError):  # sparse and other storage-less tensors
        return None


def peak_memory_bytes(
    fn: Callable[[], Any],
    device: torch.device | str = "cpu",
    preexisting: Iterable[torch.Tensor] = (),
) -> int:
    """Peak bytes of tensor memory while ``fn()`` runs, above what was allocated before it started.

    On CUDA this is the caching allocator's ``max_memory_allocated`` delta; elsewhere a tensor tracker.
    ``preexisting`` (e.g. the model's parameters) only matter on CPU, where they are added to the peak
    so both paths report the same quantity: memory in use at the worst moment, beyond the start.
    """
    dev = torch.device(device)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        start = torch.cuda.memory_allocated(dev)
        fn()
        torch.cuda.synchronize(dev)
        return int(torch.cuda.max_memory_allocated(dev) - start)
    with TensorMemoryTracker(preexisting) as tracker:
        fn()
    return int(tracker.peak_bytes - tracker.baseline_bytes)


def measure_step_memory(
    model: torch.nn.Module,
    batch: Any,
    loss_fn: Callable[[torch.nn.Module, Any], torch.Tensor],
    device: torch.device | str = "cpu",
) -> int:
    """Peak tensor bytes of one forward+backward (beyond the parameters), gradients cleared after."""

    def step() -> None:
        loss_fn(model, batch).backward()

    params = list(model.parameters())
    try:
        return peak_memory_bytes(step, device, preexisting=params)
    finally:
        model.zero_grad(set_to_none=True)


def activation_memory_saving(
    model: torch.nn.Module,
    targets: Iterable[Target],
    batch: Any,
    loss_fn: Callable[[torch.nn.Module, Any], torch.Tensor],
    device: torch.device | str = "cpu",
) -> tuple[int, int]:
    """Measured peak step memory ``(without, with)`` checkpointing ``targets``; the model is left unwrapped."""
    already = remove_activation_checkpointing(model)
    if already:
        raise ValueError("model already has activation checkpointing applied; remove it first")
    without = measure_step_memory(model, batch, loss_fn, device)
    apply_activation_checkpointing(model, targets)
    try:
        with_ckpt = measure_step_memory(model, batch, loss_fn, device)
    finally:
        remove_activation_checkpointing(model)
    return without, with_ckpt
