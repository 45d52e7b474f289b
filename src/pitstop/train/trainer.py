"""``fit``: the recipes composed into one loop, configured in one place (``TrainConfig``).

The model, optimizer, loss and loaders stay the user's; ``fit`` applies the fast path around them
(device, precision, channels_last, compile, DDP/FSDP, prefetch, accumulation, schedule, checkpoints)
and returns what it measured. Every recipe is also usable alone from ``pitstop.train``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from pitstop.recipes import model_components
from pitstop.recipes.activation_checkpointing import apply_activation_checkpointing
from pitstop.recipes.compile import failed as compile_failed
from pitstop.recipes.compile import inner as compile_inner
from pitstop.recipes.host_memory import keep_host_memory
from pitstop.recipes.step import accumulate, scale_loss, sync_context
from pitstop.train.amp import Amp
from pitstop.train.backends import configure_backends
from pitstop.train.checkpoint_io import (
    TrainState,
    capture_rng_state,
    is_fsdp,
    load_checkpoint,
    restore_rng_state,
    save_checkpoint,
)
from pitstop.train.compile import maybe_compile, unwrap
from pitstop.train.compile_auto import AutoCompile
from pitstop.train.config import FitResult, OptimizerLike, TrainConfig
from pitstop.train.distributed import (
    DistEnv,
    barrier,
    init_distributed,
    resolve_device,
    set_epoch,
    wrap_ddp,
    wrap_fsdp,
)
from pitstop.train.evaluation import ComputeLoss, LossFn, default_compute_loss, evaluate
from pitstop.train.metrics import RunningMean, batch_size
from pitstop.train.optim import make_optimizer
from pitstop.train.prefetch import DevicePrefetcher
from pitstop.train.progress import TrainProgress, nvtx_fetches, nvtx_range
from pitstop.train.schedules import make_scheduler, total_steps

_END = object()  # next()'s default: the iterator ran out


def prepare_model(
    model: torch.nn.Module, cfg: TrainConfig, env: DistEnv, amp: Amp, undo: list[Any] | None = None
) -> tuple[torch.nn.Module, dict[str, Any]]:
    """Apply device, channels_last, activation checkpointing, DDP/FSDP and compile, in that order;
    ``undo`` gets the handles of the hooks ``train_model`` added (``fit`` removes them at its end)."""
    applied: dict[str, Any] = {"device": str(env.device), "precision": amp.name, "world_size": env.world_size}
    model = model.to(env.device)
    knobs = cfg.knobs(env.device, model)
    for comp in model_components():  # channels_last, ...: each decides "auto" itself (``wanted``)
        on = getattr(knobs, comp.KNOB)
        if on:
            comp.apply_model(model)
            added = comp.train_model(model)  # what only a loop that owns the backward adds (NHWC gradients)
            if undo is not None:
                undo += added
        applied[comp.KNOB] = on
    if cfg.activation_checkpointing:
        applied["activation_checkpointing"] = apply_activation_checkpointing(
            model, cfg.activation_checkpointing
        )
    strategy = cfg.distributed
    if strategy == "auto":
        strategy = "ddp" if env.is_distributed else "none"
    if strategy == "fsdp":
        model = wrap_fsdp(model, env, cfg.fsdp_shard, amp.dtype)
    elif strategy == "ddp":
        model = wrap_ddp(model, env)
    elif strategy != "none":
        raise ValueError(f"distributed must be auto, ddp, fsdp or none, got {cfg.distributed!r}")
    applied["distributed"] = strategy if env.is_distributed else "none"
    if cfg.compile not in (True, False, "auto"):
        raise ValueError(f"compile must be True, False or 'auto', got {cfg.compile!r}")
    model = maybe_compile(model, bool(cfg.compile) and cfg.compile != "auto")
    applied["compile"] = cfg.compile
    if cfg.compile == "auto" and (env.is_distributed or not hasattr(torch, "compile")):  # no probe (_auto)
        why = "not tried under DDP/FSDP" if env.is_distributed else "this torch has no torch.compile"
        applied["compile"] = "compile auto: off: " + why
    applied.update(configure_backends(env.device, knobs.tf32, knobs.cudnn_benchmark))
    # auto: on for CPU only; on CUDA the step's tensors live in the caching allocator
    applied["host_memory"] = str(keep_host_memory()) if knobs.keep_host_memory else "off"
    return model, applied


def _gather_rng(env: DistEnv) -> list[dict[str, Any]]:
    mine = capture_rng_state()
    if not env.is_distributed:
        return [mine]
    out: list[Any] = [None] * env.world_size
    dist.all_gather_object(out, mine)
    return out


@dataclass
class _Loop:
    """What ``fit``'s stages share: the prepared model and its helpers, and the counts the loop advances."""

    cfg: TrainConfig
    env: DistEnv
    amp: Amp
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any
    compute: ComputeLoss
    loader: DevicePrefetcher
    n_batches: int | None
    applied: dict[str, Any]
    ckpt: Path | None
    state: TrainState  # the checkpoint resumed from (a fresh one otherwise)
    resumed: int | None
    planned: int | None
    on_log: Callable[[dict[str, float]], None] | None
    loss_avg: RunningMean
    params: list[torch.nn.Parameter]
    step_lr: float
    step: int = 0
    samples: int = 0
    epoch: int = 0
    consumed: int = 0  # batches of this epoch trained on
    epoch_rng: list[dict[str, Any]] | None = None  # every rank's RNG state at the epoch's start
    done: bool = False
    history: list[dict[str, float]] = field(default_factory=list)
    val_history: list[dict[str, float]] = field(default_factory=list)
    prog: Any = None  # the TrainProgress while the loop runs
    auto: AutoCompile | None = None  # compile='auto' until it has decided
    eager: torch.nn.Module | None = None  # compile='auto': the model as prepared, and its compiled twin
    compiled: torch.nn.Module | None = None  # (the trial switches between them; they share parameters)

    @property
    def nvtx(self) -> bool:
        return self.cfg.nvtx and self.env.device.type == "cuda"


def fit(
    model: torch.nn.Module,
    optimizer: OptimizerLike,
    train_loader: Iterable[Any],
    loss_fn: LossFn | None = None,
    config: TrainConfig | None = None,
    *,
    compute_loss: ComputeLoss | None = None,
    val_loader: Iterable[Any] | None = None,
    scheduler: Any = None,
    on_log: Callable[[dict[str, float]], None] | None = None,
) -> FitResult:
    """Train ``model`` on ``train_loader`` with the recipes ``config`` turns on; return a ``FitResult``.

    optimizer: an optimizer over ``model``'s parameters, a factory ``model -> optimizer`` (needed for
    FSDP, which replaces parameters), or None for fused AdamW(``config.lr``, ``config.weight_decay``).
    loss_fn: ``(output, target) -> loss`` for ``(x, y)`` batches; or ``compute_loss(model, batch)`` for
    anything else (e.g. distillation). scheduler: an LR scheduler stepped once per optimizer step, or
    set ``config.schedule``. Under torchrun, only rank 0 shows progress and writes checkpoints.
    Ctrl-C stops training and returns what was measured (``interrupted=True``); the last periodic
    checkpoint remains the resume point. The forward hooks ``fit`` adds to the model's modules
    (channels_last's NHWC gradients) are removed when it returns or raises.
    """
    compute = compute_loss or default_compute_loss(loss_fn)
    undo: list[Any] = []  # hooks fit added to the user's modules: the model it hands back has none
    try:
        lp = _prepare(
            model, optimizer, train_loader, config or TrainConfig(), compute, scheduler, on_log, undo
        )
        elapsed, interrupted = _run(lp, val_loader, loss_fn, compute_loss)
    finally:
        for handle in undo:
            handle.remove()
    return FitResult(
        steps=lp.step,
        epochs_completed=lp.epoch,
        samples=lp.samples,
        elapsed_s=elapsed,
        samples_per_s=lp.samples / elapsed if elapsed > 0 else 0.0,
        history=lp.history,
        val=lp.val_history,
        applied=lp.applied,
        resumed_from_step=lp.resumed,
        interrupted=interrupted,
    )


def _run(
    lp: _Loop, val_loader: Iterable[Any] | None, loss_fn: LossFn | None, compute_loss: ComputeLoss | None
) -> tuple[float, bool]:
    """``fit``'s loop under its progress display, then the final checkpoint; (seconds, interrupted)."""
    lp.model.train()
    t0 = time.perf_counter()
    interrupted = False
    with TrainProgress(lp.planned, enabled=lp.cfg.progress and lp.env.is_main) as lp.prog:
        lp.prog.advance(lp.step)
        try:
            _train(lp, val_loader, loss_fn, compute_loss)
        except KeyboardInterrupt:  # stop cleanly: keep what was measured; resume from the last checkpoint
            interrupted = True
        if lp.auto is not None:  # compile='auto' never decided: say why
            lp.applied["compile"] = lp.auto.undecided(lp.step, interrupted)
        if lp.ckpt is not None and not interrupted:  # mid-step state is not a resume point
            _save(lp)
            if lp.env.is_distributed:
                barrier()  # no rank returns before the final checkpoint is on disk
    return time.perf_counter() - t0, interrupted


def _prepare(
    model: torch.nn.Module,
    optimizer: OptimizerLike,
    train_loader: Iterable[Any],
    cfg: TrainConfig,
    compute: ComputeLoss,
    scheduler: Any,
    on_log: Callable[[dict[str, float]], None] | None,
    undo: list[Any],
) -> _Loop:
    """Join the process group (unless ``distributed='none'``), prepare the model, build the optimizer,
    the prefetching loader and the configured schedule, and resume from the checkpoint if there is one."""
    if cfg.accum_steps < 1:
        raise ValueError("accum_steps must be >= 1")
    if cfg.seed is not None:
        torch.manual_seed(cfg.seed)
    if cfg.distributed == "none":  # single-process on purpose: do not join a torchrun group
        dev = resolve_device(cfg.device)
        env = DistEnv(device=dev)
    else:
        env = init_distributed(cfg.device or None)
    amp = Amp.create(cfg.precision, env.device)
    model, applied = prepare_model(model, cfg, env, amp, undo)
    if optimizer is None:
        optimizer = make_optimizer(unwrap(model), lr=cfg.lr, weight_decay=cfg.weight_decay)
    elif not isinstance(optimizer, torch.optim.Optimizer):
        optimizer = optimizer(unwrap(model))
    applied["optimizer"] = type(optimizer).__name__ + (" fused" if optimizer.defaults.get("fused") else "")
    loader = DevicePrefetcher(train_loader, env.device, channels_last=applied["channels_last"])
    n_batches = _length(loader)
    if scheduler is None and cfg.schedule is not None:
        if n_batches is None:
            raise ValueError("config.schedule needs a loader with a length")
        max_lr = cfg.max_lr if cfg.max_lr is not None else cfg.lr
        scheduler = make_scheduler(
            cfg.schedule,
            optimizer,
            n_batches,
            cfg.epochs,
            cfg.accum_steps,
            max_lr,
            cfg.base_lr,
            cfg.max_steps,
        )
    applied["accum_steps"] = cfg.accum_steps

    state = TrainState()
    resumed: int | None = None
    ckpt = Path(cfg.checkpoint_path) if cfg.checkpoint_path else None
    if ckpt is not None and cfg.resume and ckpt.exists():
        state = load_checkpoint(ckpt, unwrap(model), optimizer, scheduler, amp.scaler, env.device)
        resumed = state.step
    planned = total_steps(n_batches, cfg.epochs, cfg.accum_steps) if n_batches else None
    if cfg.max_steps is not None:
        planned = min(planned, cfg.max_steps) if planned else cfg.max_steps
    return _Loop(
        cfg=cfg,
        env=env,
        amp=amp,
        model=model,
        optimizer=optimizer,
        scheduler=scheduler,
        compute=compute,
        loader=loader,
        n_batches=n_batches,
        applied=applied,
        ckpt=ckpt,
        state=state,
        resumed=resumed,
        planned=planned,
        on_log=on_log,
        loss_avg=RunningMean(env.device),
        params=list(unwrap(model).parameters()),
        step_lr=optimizer.param_groups[0]["lr"],
        step=state.step,
        epoch=state.epoch,
        consumed=state.batches_in_epoch,
        done=planned is not None and state.step >= planned,
        auto=_auto(cfg, env, planned),
    )


def _length(loader: DevicePrefetcher) -> int | None:
    try:
        return len(loader)
    except TypeError:  # an iterable loader without a length
        return None


def _auto(cfg: TrainConfig, env: DistEnv, planned: int | None) -> AutoCompile | None:
    """The compile='auto' probe, for a single-process run (a mid-run switch is not tried under DDP/FSDP)."""
    if cfg.compile != "auto" or env.is_distributed or not hasattr(torch, "compile"):
        return None
    return AutoCompile(planned, env.device.type)


def _decide_compile(lp: _Loop) -> None:
    """compile='auto' after a step: the model the next step runs (eager, or compiled for the trial or for
    good), and once decided, the decision, printed and in ``applied``."""
    auto = lp.auto
    assert auto is not None
    if lp.eager is None:
        lp.eager = lp.model
    use = auto.decide(lp.step, compile_failed(lp.compiled) if lp.compiled is not None else None)
    if use and lp.compiled is None:
        if auto.started:
            lp.prog.note(auto.started)
        lp.compiled = maybe_compile(lp.eager)
    lp.model = lp.compiled if use and lp.compiled is not None else lp.eager
    if auto.decision is None:
        return
    lp.applied["compile"] = auto.decision
    lp.prog.note(auto.decision)
    lp.auto, lp.compiled = None, lp.compiled if use else None


def _train(
    lp: _Loop, val_loader: Iterable[Any] | None, loss_fn: LossFn | None, compute_loss: ComputeLoss | None
) -> None:
    """The epochs, until ``cfg.epochs`` or ``cfg.max_steps``: train, log, then evaluate on ``val_loader``."""
    first = True
    while lp.epoch < lp.cfg.epochs and not lp.done:
        data = _start_epoch(lp, resuming=first and lp.resumed is not None)
        first = False
        exhausted = _train_epoch(lp, data)
        if lp.loss_avg.count:
            _log(lp)
        # a loader may yield fewer batches than its len() says: its iterator ends the epoch
        if exhausted or lp.n_batches is None or lp.consumed >= lp.n_batches:
            lp.epoch, lp.consumed = lp.epoch + 1, 0
        if val_loader is not None:  # every rank: FSDP needs all of them, DDP averages their shares
            env = lp.env
            # compile='auto' charged one compilation, the training graph's; no_grad would be another
            model = (compile_inner(lp.model) or lp.model) if lp.cfg.compile == "auto" else lp.model
            val = evaluate(model, val_loader, loss_fn, compute_loss, lp.amp, env.device, env.is_distributed)
            lp.val_history.append({"epoch": lp.epoch, **val})


def _start_epoch(lp: _Loop, resuming: bool) -> Iterator[Any]:
    """The epoch's batch iterator; on resume, past the batches already trained on, with the RNG state of
    the moment the checkpoint was saved."""
    state = lp.state
    skip = state.batches_in_epoch if resuming else 0
    if resuming and skip and state.epoch_rng:
        # Replay the epoch's start so the loader draws the same shuffle, skip what was trained on,
        # then continue from the RNG state at the moment of saving.
        restore_rng_state(_pick(state.epoch_rng, lp.env))
    elif resuming and state.rng:
        restore_rng_state(_pick(state.rng, lp.env))
    lp.epoch_rng = _gather_rng(lp.env) if lp.ckpt is not None else None
    set_epoch(lp.loader, lp.epoch)
    data = iter(lp.loader)
    for _ in range(skip):
        if next(data, _END) is _END:  # fewer batches than the checkpoint trained on: the epoch is over
            break
    if resuming and skip and state.rng:
        restore_rng_state(_pick(state.rng, lp.env))
    lp.consumed = skip
    return data


def _train_epoch(lp: _Loop, data: Iterator[Any]) -> bool:
    """Forward, backward and (every ``accum_steps`` batches) an optimizer step over ``data``, logging and
    checkpointing on their step counts; stops at ``cfg.max_steps`` (``lp.done``). Whether ``data`` ran
    out (the epoch is over)."""
    cfg, amp, nvtx = lp.cfg, lp.amp, lp.nvtx
    step_samples = 0
    for batch, last in accumulate(nvtx_fetches(data, nvtx), cfg.accum_steps):
        lp.consumed += 1
        with sync_context(lp.model, last):  # lp.model: compile='auto' may compile it mid-run
            with nvtx_range("forward", nvtx), amp.autocast():
                loss = lp.compute(lp.model, batch)
            with nvtx_range("backward", nvtx):
                amp.backward(scale_loss(loss, cfg.accum_steps))
        n = batch_size(batch)
        step_samples += n
        lp.loss_avg.update(loss, n)
        if not last:
            continue
        lp.step_lr = lp.optimizer.param_groups[0]["lr"]  # the LR this step used, for the log
        with nvtx_range("optimizer", nvtx):
            amp.step(lp.optimizer, cfg.clip_grad_norm, lp.params)
            if lp.scheduler is not None:
                lp.scheduler.step()
        lp.step += 1
        lp.samples += step_samples
        lp.prog.advance(1, step_samples)
        step_samples = 0
        if lp.auto is not None:
            _decide_compile(lp)
        if lp.step % cfg.log_every == 0:
            _log(lp)
        if lp.ckpt is not None and cfg.checkpoint_every and lp.step % cfg.checkpoint_every == 0:
            _save(lp)
        if cfg.max_steps is not None and lp.step >= cfg.max_steps:
            lp.done = True
            return False
    return True


def _pick(states: list[dict[str, Any]], env: DistEnv) -> dict[str, Any]:
    """This rank's RNG state (the last one where fewer ranks saved)."""
    return states[min(env.rank, len(states) - 1)]


def _save(lp: _Loop) -> None:
    """Checkpoint the current step; a finished epoch resumes at the start of the next one."""
    ep, consumed, epoch_rng = lp.epoch, lp.consumed, lp.epoch_rng
    if lp.n_batches is not None and consumed >= lp.n_batches:
        ep, consumed, epoch_rng = ep + 1, 0, None
    st = TrainState(lp.step, ep, consumed, epoch_rng, _gather_rng(lp.env))
    plain = unwrap(lp.model)
    if lp.env.is_main or is_fsdp(plain):  # FSDP gathers the full state collectively; rank 0 writes
        save_checkpoint(lp.ckpt, plain, lp.optimizer, lp.scheduler, lp.amp.scaler, st, write=lp.env.is_main)  # type: ignore[arg-type]


def _log(lp: _Loop) -> None:
    """Read the running loss (a host sync), append a history row and pass it to ``on_log`` on rank 0."""
    loss = lp.loss_avg.read()
    lr = float(lp.step_lr)
    rate = lp.prog.log(loss, lr)
    row = {"step": lp.step, "epoch": lp.epoch, "loss": loss, "lr": lr, "samples_per_s": rate}
    lp.history.append(row)
    if lp.on_log is not None and lp.env.is_main:
        lp.on_log(row)
