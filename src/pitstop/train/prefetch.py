"""Device prefetch: copy batch n+1 to the GPU on a side stream while step n computes.

With pinned host memory and ``non_blocking=True`` the copy is a DMA that overlaps compute instead of
stalling the step. On CPU there is nothing to overlap, so the wrapper only applies the memory format.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch

from pitstop.recipes import channels_last


def move_to(batch: Any, device: torch.device, non_blocking: bool = False) -> Any:
    """``batch`` (tensor / tuple / list / dict, nested) with every tensor on ``device``."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=non_blocking)
    if isinstance(batch, (list, tuple)):
        out = [move_to(b, device, non_blocking) for b in batch]
        return type(batch)(*out) if hasattr(batch, "_fields") else type(batch)(out)
    if isinstance(batch, dict):
        return {k: move_to(v, device, non_blocking) for k, v in batch.items()}
    return batch


def _pin(batch: Any) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch if batch.is_pinned() else batch.pin_memory()
    if isinstance(batch, (list, tuple)):
        out = [_pin(b) for b in batch]
        return type(batch)(*out) if hasattr(batch, "_fields") else type(batch)(out)
    if isinstance(batch, dict):
        return {k: _pin(v) for k, v in batch.items()}
    return batch


def _record_stream(batch: Any, stream: Any) -> None:
    if isinstance(batch, torch.Tensor):
        batch.record_stream(stream)
    elif isinstance(batch, (list, tuple)):
        for b in batch:
            _record_stream(b, stream)
    elif isinstance(batch, dict):
        for b in batch.values():
            _record_stream(b, stream)


class DevicePrefetcher:
    """Iterate ``loader`` with batches already on ``device`` (and channels_last if asked).

    CUDA: the next batch is pinned (unless the loader already pins) and copied on a side stream; the
    compute stream waits on that copy only when the batch is handed out, and ``record_stream`` keeps the
    allocator from reusing its memory early. CPU: batches pass through (format conversion only).
    ``len()`` and ``set_epoch`` (for a DistributedSampler) pass through to the loader.
    """

    def __init__(
        self, loader: Iterable[Any], device: torch.device | str, channels_last: bool = False
    ) -> None:
        self.loader = loader
        self.device = torch.device(device)
        self.channels_last = channels_last
        self._cuda = self.device.type == "cuda"

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    def _prepare(self, batch: Any) -> Any:
        return channels_last.apply_input(batch) if self.channels_last else batch

    def __iter__(self) -> Iterator[Any]:
        if not self._cuda:
            for batch in self.loader:
                yield self._prepare(move_to(batch, self.device))
            return
        stream = torch.cuda.Stream(device=self.device)
        it = iter(self.loader)

        def load() -> Any:
            try:
                host = next(it)
            except StopIteration:
                return StopIteration
            with torch.cuda.stream(stream):
                return self._prepare(move_to(_pin(host), self.device, non_blocking=True))

        nxt = load()
        while nxt is not StopIteration:
            torch.cuda.current_stream(self.device).wait_stream(stream)
            cur = nxt
            _record_stream(cur, torch.cuda.current_stream(self.device))
            nxt = load()  # issue the next copy before the caller computes on `cur`
            yield cur
