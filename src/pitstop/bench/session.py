"""One ablation config made runnable: model, optimizer and an endless loader, and ``step()``.

Each optimization is applied with pitstop.train's recipe (Amp, make_optimizer) or its component
(activation checkpointing and accumulation: ``pitstop.recipes.activation_checkpointing``,
``pitstop.recipes.step``; ``pitstop.recipes.channels_last``,
every one whose knob the row's ``Knobs`` turn on: ``pitstop.recipes.enabled``; a process-wide one, tf32, set
around each step: ``scoped``; one that wraps the model's call, compile: ``wrap``), one at a time, so a row measures that optimization and nothing else. Peers (Lightning, Accelerate) run the baseline step through their own loop.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn

from pitstop.bench.configs import BenchConfig
from pitstop.bench.workloads import Workload, repeated_blocks
from pitstop.measure.clock import Stopwatch, time_block
from pitstop.recipes import components, dataloader, enabled
from pitstop.recipes import threads as intra_op
from pitstop.recipes.activation_checkpointing import apply_activation_checkpointing
from pitstop.recipes.component import PROCESS, WRAP
from pitstop.recipes.step import scale_loss
from pitstop.train import Amp, make_grad_scaler, make_optimizer

if TYPE_CHECKING:
    from pitstop.recipes.component import ProcessComponent, WrapComponent

# Marks each forward pass, so the memory probe can read what is held for backward when forward ends.
FORWARD_MARK = "pitstop.bench.forward"


def checkpoint_blocks(model: nn.Module) -> list[str]:
    """Checkpoint every repeated block (ResNet stages' blocks, transformer layers) with pitstop.train's
    recipe; returns the qualified names wrapped."""
    names = repeated_blocks(model)
    if not names:
        raise ValueError("no repeated blocks found to checkpoint in this model")
    return apply_activation_checkpointing(model, names)


def endless_loader(
    workload: Workload, config: BenchConfig, micro_batch: int, seed: int
) -> torch.utils.data.DataLoader:
    ds = workload.make_dataset()
    g = torch.Generator().manual_seed(seed)
    sampler = torch.utils.data.RandomSampler(ds, replacement=True, num_samples=2**31 - 1, generator=g)
    # the row's DataLoader keywords forced by the loader components (``recipes.dataloader``), as profile
    # injects them; a row with workers keeps them (the loader is endless)
    kw: dict[str, Any] = {"num_workers": 0, "pin_memory": False, "persistent_workers": config.num_workers > 0}
    dataloader.inject(kw, config.dataloader)
    return torch.utils.data.DataLoader(ds, batch_size=micro_batch, sampler=sampler, drop_last=True, **kw)


class Session:
    """A live training setup for one config; ``step()`` runs one optimizer step (all micro-batches)."""

    def __init__(self, workload: Workload, config: BenchConfig, device: str = "cpu", seed: int = 0) -> None:
        self.workload, self.config, self.device = workload, config, torch.device(device)
        torch.manual_seed(seed)
        model = workload.make_model()
        self.checkpointed = checkpoint_blocks(model) if config.checkpoint else []
        model.to(self.device)
        self.components = enabled(config)  # channels_last, ...: the model and its batches changed
        # tf32, ...: process-wide, so set around each step and restored after (the rows interleave)
        procs = cast("list[ProcessComponent]", components(PROCESS))
        self.process = [c for c in procs if getattr(config, c.KNOB, False)]
        for comp in self.components:
            comp.apply_model(model)
        self.model: nn.Module = model
        self.optimizer = make_optimizer(model, "adamw", lr=1e-3, fused=config.fused)
        self.micro_batch = max(1, workload.batch_size // config.accumulation)
        self.loader = endless_loader(workload, config, self.micro_batch, seed)
        self.batches = iter(self.loader)
        dtype = getattr(torch, config.amp) if config.amp else None
        self.amp = Amp(self.device, dtype, make_grad_scaler(self.device, dtype))
        # compile, ...: the model's call wrapped (the optimizer keeps the plain model's parameters)
        wraps = cast("list[WrapComponent]", components(WRAP))
        self.wraps = [c for c in wraps if getattr(config, c.KNOB, False)]
        self.forward: nn.Module = model
        for comp in self.wraps:
            self.forward = comp.wrap(self.forward)
        self.steps_done = 0

    @property
    def samples_per_step(self) -> int:
        return self.micro_batch * self.config.accumulation

    def _next(self) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = next(self.batches)
        x = x.to(self.device, non_blocking=self.config.pin_memory)
        y = y.to(self.device, non_blocking=self.config.pin_memory)
        for comp in self.components:
            x = comp.apply_input(x)
        return x, y

    def step(self) -> None:
        if not self.process:
            return self._step()
        with contextlib.ExitStack() as settings:
            for comp in self.process:
                settings.enter_context(comp.scoped(self.device.type, getattr(self.config, comp.KNOB)))
            self._step()

    def _step(self) -> None:
        accum = self.config.accumulation
        for _ in range(accum):
            x, y = self._next()
            with torch.profiler.record_function(FORWARD_MARK), self.amp.autocast():
                loss = scale_loss(self.workload.loss(self.forward(x), y), accum)
            self.amp.backward(loss)
        self.amp.step(self.optimizer)
        self.steps_done += 1

    def compile_error(self) -> BaseException | None:
        """The error a wrapper of the model's call (torch.compile) fell back to eager on, if any."""
        return next((e for c in self.wraps if (e := c.failed(self.forward)) is not None), None)

    def block(self, steps: int, threads: int) -> float:
        """Mean seconds per step over one block of ``steps`` steps, after one untimed step that re-warms
        caches and allocator after the other configs ran (torch.utils.benchmark's recipe: warm-up, fixed
        threads, CUDA synchronized at both ends of the timed region)."""
        with intra_op.scoped(self.device.type, threads):  # the threads component: restored after
            return time_block(self.step, steps, self.sync, warmup=1)

    def sync(self) -> None:
        """Wait for the device's queued work (a no-op off CUDA)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def close(self) -> None:
        # Ends persistent loader workers now rather than at interpreter exit.
        self.batches = iter(())
        self.loader = None  # type: ignore[assignment]


class AcceleratePeer(Session):
    """The baseline step through Hugging Face Accelerate (prepare + accelerator.backward)."""

    def __init__(self, workload: Workload, config: BenchConfig, device: str = "cpu", seed: int = 0) -> None:
        super().__init__(workload, config, device, seed)
        from accelerate import Accelerator

        self.accelerator = Accelerator(cpu=self.device.type == "cpu", mixed_precision="no")
        self.model, self.optimizer, self.loader = self.accelerator.prepare(
            self.model, self.optimizer, self.loader
        )
        self.forward = self.model
        self.batches = iter(self.loader)

    def _next(self) -> tuple[torch.Tensor, torch.Tensor]:
        return next(self.batches)  # accelerate's loader already places batches on the device

    def step(self) -> None:
        x, y = self._next()
        with torch.profiler.record_function(FORWARD_MARK):
            loss = self.workload.loss(self.forward(x), y)
        self.accelerator.backward(loss)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.steps_done += 1


class LightningPeer(Session):
    """The baseline step through a Lightning Trainer; each block is one ``fit`` of warm-up + ``steps``
    steps, timed by a callback between batches so Trainer start-up is not counted."""

    def __init__(self, workload: Workload, config: BenchConfig, device: str = "cpu", seed: int = 0) -> None:
        super().__init__(workload, config, device, seed)
        import lightning.pytorch as pl

        for name in ("lightning.pytorch", "lightning.fabric", "lightning"):
            logging.getLogger(name).setLevel(logging.ERROR)
        self.pl = pl
        self.module = _lightning_module(pl, self.model, workload, self.optimizer)

    def _fit(self, steps: int) -> list[float]:
        pl = self.pl
        stamps: list[float] = []
        cuda, watch = self.device.type == "cuda", Stopwatch()

        class Stamp(pl.Callback):
            def on_train_batch_start(self, *a: Any, **k: Any) -> None:
                stamps.append(watch.elapsed())

            def on_train_batch_end(self, *a: Any, **k: Any) -> None:
                if cuda:
                    torch.cuda.synchronize()
                stamps.append(watch.elapsed())

        trainer = pl.Trainer(
            accelerator="gpu" if self.device.type == "cuda" else "cpu",
            devices=1,
            max_steps=steps,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            num_sanity_val_steps=0,
            callbacks=[Stamp()],
        )
        with warnings.catch_warnings(), contextlib.redirect_stdout(None):
            warnings.simplefilter("ignore")
            trainer.fit(self.module, train_dataloaders=self.loader)
        self.steps_done += steps
        return stamps

    def step(self) -> None:
        self._fit(1)

    def block(self, steps: int, threads: int) -> float:
        with intra_op.scoped(self.device.type, threads):
            stamps = self._fit(steps + 1)  # the first batch pays the loader start: not timed
        # stamps: start0, end0, start1, end1, ...; time from the end of batch 0 to the end of the last.
        return (stamps[-1] - stamps[1]) / steps


def _lightning_module(pl: Any, model: nn.Module, workload: Workload, optimizer: torch.optim.Optimizer) -> Any:
    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            return workload.loss(self.model(x), y)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return optimizer

    return Module()


def make_session(workload: Workload, config: BenchConfig, device: str = "cpu", seed: int = 0) -> Session:
    if config.peer == "accelerate":
        return AcceleratePeer(workload, config, device, seed)
    if config.peer == "lightning":
        return LightningPeer(workload, config, device, seed)
    return Session(workload, config, device, seed)
