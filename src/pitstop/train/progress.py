"""Progress with throughput and ETA (rich), and NVTX ranges so Nsight Systems shows each phase."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn


@contextlib.contextmanager
def nvtx_range(name: str, enabled: bool = True) -> Iterator[None]:
    """An NVTX range on CUDA builds with a GPU present (visible in Nsight Systems); no-op otherwise."""
    if enabled and torch.cuda.is_available():
        torch.cuda.nvtx.range_push(name)
        try:
            yield
        finally:
            torch.cuda.nvtx.range_pop()
    else:
        yield


class TrainProgress:
    """A rich bar over optimizer steps showing loss, samples/s and ETA; silent when disabled.

    Throughput is computed from host wall time between ``log`` calls (which follow a metrics read, i.e.
    after the device caught up), so it is the real rate, not the rate of queueing work.
    """

    def __init__(self, total_steps: int | None, enabled: bool = True, console: Console | None = None) -> None:
        self.enabled = enabled
        self._progress: Progress | None = None
        self._task = None
        self._t = time.perf_counter()
        self._samples = 0
        if enabled:
            self._progress = Progress(
                TextColumn("[bold]train"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[info]}"),
                TimeRemainingColumn(),
                console=console or Console(stderr=True),
                transient=False,
            )
            self._task = self._progress.add_task("train", total=total_steps, info="")

    def __enter__(self) -> TrainProgress:
        if self._progress is not None:
            self._progress.start()
        self._t = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()

    def advance(self, steps: int = 1, samples: int = 0) -> None:
        self._samples += samples
        if self._progress is not None:
            self._progress.advance(self._task, steps)  # type: ignore[arg-type]

    def note(self, text: str) -> None:
        """A line above the bar (a decision the user should see); nothing when the bar is off."""
        if self._progress is not None:
            self._progress.console.print(text)

    def log(self, loss: float, lr: float) -> float:
        """Show loss/lr and the samples/s since the last log; returns that throughput."""
        now = time.perf_counter()
        rate = self._samples / max(now - self._t, 1e-9)
        self._t, self._samples = now, 0
        if self._progress is not None:
            self._progress.update(self._task, info=f"loss {loss:.4f}  lr {lr:.2e}  {rate:,.0f} samples/s")  # type: ignore[arg-type]
        return rate


def nvtx_fetches(it: Iterable[Any], nvtx: bool) -> Iterable[Any]:
    """The loader with an NVTX 'data' range around each fetch (Nsight then shows loader stalls)."""
    it = iter(it)
    while True:
        with nvtx_range("data", nvtx):
            try:
                batch = next(it)
            except StopIteration:
                return
        yield batch
