"""What the instrumentation captured of the script: its loaders, models, optimizers, last batch.

A ``pitstop tune`` callback receives ``Captured`` inside the user's process.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from pitstop.recipes import loader_components


@dataclass
class CapturedLoader:
    """A DataLoader the script built: the object, the kwargs it was built with, and where."""

    loader: Any
    kwargs: dict[str, Any]
    dataset: Any
    location: str | None
    applied: dict[str, Any] = field(default_factory=dict)  # overrides that were forced on it
    skipped: dict[str, str] = field(default_factory=dict)  # overrides that could not apply, and why
    iterators: int = 0  # iterators that started a fresh worker pool (or a fresh pass)
    batches: int = 0
    wait_s: float = 0.0
    first_batch_s: list[float] = field(default_factory=list)

    def settings(self) -> dict[str, Any]:
        ld = self.loader
        try:
            length = len(self.dataset)
        except TypeError:
            length = None
        try:
            n_batches = len(ld)
        except TypeError:
            n_batches = None
        return {
            "location": self.location,
            # num_workers, persistent_workers, pin_memory: each loader component's record
            **{k: v for c in loader_components() for k, v in c.facts(ld).items()},
            "prefetch_factor": ld.prefetch_factor,
            "batch_size": ld.batch_size,
            "drop_last": bool(ld.drop_last),
            "dataset_type": type(self.dataset).__name__,
            "dataset_len": length,
            "batches_per_epoch": n_batches,
            "iterable_dataset": isinstance(self.dataset, torch.utils.data.IterableDataset),
            "overrides_applied": self.applied,
            "overrides_skipped": self.skipped,
            "iterators": self.iterators,
            "batches_seen": self.batches,
            "wait_s": self.wait_s,
            "first_batch_s": self.first_batch_s,
        }


@dataclass
class Captured:
    """What a ``pitstop tune`` callback receives inside the user's process.

    loaders:    CapturedLoader records, in construction order.
    models:     top-level nn.Modules with parameters that ran forward.
    optimizers: every optimizer constructed.
    device:     the device batches were moved to (None when never seen, e.g. CPU-only training).
    last_batch: the last batch a DataLoader returned; ``last_inputs`` the last (args, kwargs) of a
                top-level forward.
    out_dir:    the run's output folder, for files the callback wants to leave.
    """

    loaders: list[CapturedLoader] = field(default_factory=list)
    models: list[torch.nn.Module] = field(default_factory=list)
    optimizers: list[torch.optim.Optimizer] = field(default_factory=list)
    device: torch.device | None = None
    last_batch: Any = None
    last_inputs: tuple[tuple[Any, ...], dict[str, Any]] | None = None
    out_dir: Path = field(default_factory=Path.cwd)
