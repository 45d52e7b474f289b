"""The options of `pitstop tune loader|batch-size|lr`, one dataclass per command; argparse is built from them
(``pitstop.cliopts``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pitstop.cliopts import opt

SCRIPT = "script mode (instead of factories)"
FACTORY = "what to train (factory mode)"
DATASET_HELP = "pkg.mod:make_dataset (a Dataset, DataLoader, or factory)"


@dataclass
class ScriptArgs:
    timeout: float | None = opt(None, "stop the script after this many seconds", group=SCRIPT)
    cmd: Sequence[str] | None = opt(
        None, "-- python train.py ARGS (the script to tune)", remainder=True, group=SCRIPT
    )


@dataclass
class ModelArgs:
    model: str | None = opt(
        None, "pkg.mod:make_model or file.py:model (a module or a factory)", metavar="SPEC", group=FACTORY
    )
    dataset: str | None = opt(None, DATASET_HELP, metavar="SPEC", group=FACTORY)
    loss: str | None = opt(
        None, "pkg.mod:fn with fn(model, batch) -> loss (default: guessed)", metavar="SPEC", group=FACTORY
    )
    optimizer: str = opt(
        "sgd", "sgd | adam | adamw, or pkg.mod:fn with fn(params) -> optimizer (default: sgd)", group=FACTORY
    )
    device: str | None = opt(None, "cpu / cuda (default: cuda if available)", group=FACTORY)
    batch_size: int = opt(32, "batch size for the loader (default 32)", group=FACTORY)


@dataclass
class LoaderArgs(ScriptArgs):
    dataset: str | None = opt(None, DATASET_HELP, metavar="SPEC")
    batch_size: int = opt(32, "factory mode: batch size (default 32)")
    num_workers: int = opt(0, "factory mode: the baseline's num_workers")
    max_workers: int | None = opt(None, "highest num_workers to try (default: one rung past the cores' cap)")
    time_per_point: float = opt(1.5, "seconds of timing per setting (1.5)")
    repeats: int = opt(3, "timed windows per setting; the median is used")
    prefetch: str = opt("2,4", "prefetch_factor values to try (default 2,4)")
    batch_sizes: str = opt("", "also measure these batch sizes, e.g. 32,64,128")
    confirm_rounds: int = opt(3, "interleaved baseline/chosen rounds for the speed-up (3)")
    plot: str | None = opt(None, "write the num_workers curve as a PNG", metavar="PNG", output="file")


@dataclass
class BatchSizeArgs(ScriptArgs, ModelArgs):
    budget_mib: float | None = opt(
        None, "memory budget (default: 90%% of free GPU memory, or 50%% of available RAM on CPU)"
    )
    start: int = opt(2, "first batch size (default 2)")
    max: int = opt(65536, "largest batch size to try")
    steps: int = opt(3, "training steps per size (first is warm-up)")
    time_budget: float = opt(
        120.0,
        "seconds the search may take; a size that would not finish in time is not started (120)",
        metavar="S",
    )


@dataclass
class LRArgs(ScriptArgs, ModelArgs):
    start_lr: float = opt(1e-7)
    end_lr: float = opt(10.0)
    steps: int = opt(100, "steps of the ramp (default 100)")
    smooth: float = opt(0.98, "EMA factor for the loss (default 0.98)")
    diverge: float = opt(4.0, "stop when smoothed loss > this x its minimum")
    plot: str | None = opt(None, "write loss vs learning rate as a PNG", metavar="PNG", output="file")
