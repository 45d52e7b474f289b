"""Instrumentation inside the user's process: where each step's time goes, and what the script built.

Installed by ``pitstop.profile.bootstrap`` before the user's script runs, removed before it exits. Every
patch lives in this module and is undone by ``Instrumentation.uninstall``:

- steps: global optimizer step pre/post hooks (``torch.optim.optimizer.register_optimizer_step_*``). A step
  ends where the next one starts: the next DataLoader ``__next__``, the next top-level forward, or the
  next ``step()`` of an optimizer that already stepped, whichever comes first after an optimizer step.
  So several optimizers, LR schedulers or a GradScaler still give one step per iteration, and logging
  after ``optimizer.step()`` counts in the step that did it.
- data wait: time inside ``_BaseDataLoaderIter.__next__``; loaders: ``DataLoader.__init__`` (settings
  as constructed, file:line, overrides applied) and ``DataLoader.__iter__`` (new worker pools, first
  batch latency).
- host-to-device copies: ``Tensor.to`` / ``Tensor.cuda`` from CPU to another device (CUDA events on
  CUDA, read at the end: no added syncs).
- host syncs: targeted wrappers on ``Tensor.item/tolist/numpy/cpu/__float__/__int__/__bool__/__index__
  /__repr__/__format__`` (``pitstop.profile.syncs``); nothing else pays for them. On an accelerator tensor
  every call is a sync; on CPU a call made directly from user code counts, so the logic is the same (and
  tested) without a GPU. On CUDA, ``torch.cuda.set_sync_debug_mode("warn")`` adds syncs inside torch calls.
- models: global forward hooks find the top-level module with parameters that runs forward during the
  first step, then per-model hooks replace them (no per-module cost after the first step).
- losses: ``Tensor.backward`` keeps a detached reference per step, read once at the end.

A probe never prints: everything lands in ``Instrumentation.snapshot()``, written to a JSON file by the
bootstrap, periodically and at exit.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import os
import resource
import time
import warnings
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader
from torch.utils.data.dataloader import _BaseDataLoaderIter

from pitstop.profile.facts import GpuSampler, model_facts, torch_facts
from pitstop.profile.overrides import Overrides
from pitstop.profile.syncs import SYNC_METHODS, make_sync, new_site
from pitstop.profile.where import location, user_location
from pitstop.train.host_memory import keep_host_memory, kept, minor_page_faults

clock = time.perf_counter
# how often measurements reach the parent while steps run; the env var is for tests and debugging
FLUSH_EVERY_S = float(os.environ.get("PITSTOP_PROFILE_FLUSH_S", "1.0"))
CUDA_SYNC_WARNING = ".*synchronizing CUDA operation.*"


class StopProfiling(BaseException):
    """Raised inside the user's script to stop it after the measured steps (or after a callback).

    A BaseException so a script's ``except Exception`` does not swallow it. The bootstrap catches it and
    reports a clean stop.
    """


# ------------------------------------------------------------------------------------------- captured


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
            "num_workers": ld.num_workers,
            "pin_memory": bool(ld.pin_memory),
            "prefetch_factor": ld.prefetch_factor,
            "persistent_workers": bool(ld.persistent_workers),
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


# ------------------------------------------------------------------------------------------ the state

_DL_SIG = inspect.signature(DataLoader.__init__)
_OPTIMIZER_SIG_CACHE: dict[type, inspect.Signature] = {}


@dataclass
class Config:
    steps: int = 30
    warmup: int = 5
    full: bool = False
    trace: bool = False
    overrides: Overrides = field(default_factory=Overrides)
    callback: str | None = None
    callback_at: str = "loader"
    out_dir: Path = field(default_factory=Path.cwd)
    probes: bool = True  # measured what-ifs at the end (pitstop.profile.probes)


class Instrumentation:
    """One per process. Hooks call into it; ``snapshot()`` is what the parent reads."""

    def __init__(self, config: Config) -> None:
        self.cfg = config
        self.callback_requested = bool(config.callback)
        self.captured = Captured(out_dir=config.out_dir)
        self.t0 = clock()
        self._undo: list[Any] = []
        self._extra_undo: list[Any] = []
        self._handles: list[Any] = []
        self._global_fwd: list[Any] = []
        self._model_ids: set[int] = set()
        self._depth = 0
        self.in_next = False
        self.in_sync = False
        # current step
        self.step_start: float | None = None
        self._eval_seen = False
        self.stepped: set[int] = set()
        self.last_opt_post: float | None = None
        self._opt_t0 = 0.0
        self._fwd_t0 = 0.0
        self.data = self.h2d = self.sync = self.fwd = self.bwd = self.opt = 0.0
        self.n_syncs = 0
        self._faults0 = 0
        self.step_loss: torch.Tensor | None = None
        self._h2d_events: list[tuple[Any, Any]] = []
        # the run
        self.records: list[dict[str, Any]] = []
        self.losses: list[torch.Tensor | None] = []
        self.h2d_events: list[list[tuple[Any, Any]]] = []
        self._last_site: list[Any] | None = None  # the sync site called last, and its code/line/method
        self._last_code: Any = None
        self._last_lasti = -1
        self._last_name = ""
        self._last_sync_end = -1.0
        # (code|location, line, method) -> [calls, measured seconds, measured calls, measured loop gaps]
        self._sites: dict[tuple[Any, ...], list[Any]] = {}
        self._cpu_ignored: dict[tuple[Any, ...], Any] = {}  # sites (-> code) whose CPU syncs do not count
        self._ignored_code: Any = None  # the last of those seen, for a one-comparison repeat check
        self._ignored_lasti = -1
        self.totals = {"data_wait_s": 0.0, "batches": 0, "forward_s": 0.0, "forwards": 0, "backward_s": 0.0}
        self.warm_done = False
        self.callback_result: Any = None
        self.callback_error: str | None = None
        self.compile_error: str | None = None
        self.model_facts: dict[int, dict[str, Any]] = {}
        self.optimizer_facts: list[dict[str, Any]] = []
        self.tracer: Any = None
        self.gpu_sampler: GpuSampler | None = None
        self._last_flush = clock()
        self._flush_every = FLUSH_EVERY_S
        self.flush_path: Path | None = None
        self._autocast_ctx: list[Any] = []
        self._iterators: list[weakref.ref[Any]] = []
        self._pending_cl: set[int] = set()
        self._cuda_debug_on = False
        self.override_errors: list[str] = []

    def start_gpu_sampler(self, device: torch.device) -> None:
        if self.gpu_sampler is None:
            self.gpu_sampler = GpuSampler(device.index or 0, self.t0)
            self.gpu_sampler.start()

    # ----------------------------------------------------------------------------------- install
    def install(self) -> None:
        ov = self.cfg.overrides
        if ov.cudnn_benchmark:
            torch.backends.cudnn.benchmark = True
        if ov.keep_host_memory:
            kept_now = keep_host_memory()
            if not kept_now.applied:
                self.override_errors.append(f"keep_host_memory: {kept_now.detail}")
        if ov.compile:
            import torch._dynamo as dynamo

            dynamo.config.suppress_errors = True  # fall back to eager on compile errors
        self._patch(DataLoader, "__init__", _make_dl_init(self, DataLoader.__init__))
        self._patch(DataLoader, "__iter__", _make_dl_iter(self, DataLoader.__iter__))
        self._patch(_BaseDataLoaderIter, "__next__", _make_next(self, _BaseDataLoaderIter.__next__))
        self._patch(torch.optim.Optimizer, "__init__", _make_opt_init(self, torch.optim.Optimizer.__init__))
        self._patch(torch.Tensor, "to", _make_to(self, torch.Tensor.to))
        self._patch(torch.Tensor, "cuda", _make_to(self, torch.Tensor.cuda))
        self._patch(torch.Tensor, "backward", _make_backward(self, torch.Tensor.backward))
        for name in SYNC_METHODS:
            self._patch(torch.Tensor, name, make_sync(self, name, getattr(torch.Tensor, name)))
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        self._handles.append(register_optimizer_step_pre_hook(self._opt_pre))
        self._handles.append(register_optimizer_step_post_hook(self._opt_post))
        from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

        self._global_fwd = [
            register_module_forward_pre_hook(self._global_pre),
            register_module_forward_hook(self._global_post),
        ]

    def _install_cuda_sync_debug(self) -> None:
        """CUDA syncs our wrappers cannot see (inside torch calls): ``set_sync_debug_mode("warn")`` makes
        torch warn on each; the warnings are counted at the user's line and not shown. Only once the script
        itself has initialised CUDA: the call initialises it, which a CPU-only script must not pay for."""
        if self._cuda_debug_on or not torch.cuda.is_initialized():
            return
        self._cuda_debug_on = True
        try:
            torch.cuda.set_sync_debug_mode("warn")
        except Exception:
            return
        warnings.filterwarnings("always", message=CUDA_SYNC_WARNING)
        orig_show = warnings.showwarning

        def showwarning(
            message: Any, category: Any, filename: str, lineno: int, *args: Any, **kwargs: Any
        ) -> None:
            if "synchronizing CUDA operation" in str(message):
                self.record_cuda_sync()
                return None
            return orig_show(message, category, filename, lineno, *args, **kwargs)

        self._patch(warnings, "showwarning", showwarning)

        def undo() -> None:
            with contextlib.suppress(Exception):
                torch.cuda.set_sync_debug_mode(0)
            warnings.filters[:] = [
                f for f in warnings.filters if getattr(f[1], "pattern", None) != CUDA_SYNC_WARNING
            ]

        self._extra_undo.append(undo)

    def record_cuda_sync(self) -> None:
        """One sync reported by torch's sync debug mode (no duration: it is not ours to time)."""
        if self.in_sync or self.in_next:
            return  # a sync our own wrappers are already timing, or inside data loading
        self.n_syncs += 1
        site = new_site(self, (user_location(3) or "<library>", 0, "cuda-sync"), None, 0, "cuda-sync")
        site[0] += 1
        if self.warm_done:
            site[2] += 1

    def _patch(self, owner: Any, name: str, new: Any) -> None:
        had = name in owner.__dict__
        old = owner.__dict__.get(name)
        setattr(owner, name, new)
        self._undo.append((owner, name, had, old))

    def uninstall(self) -> None:
        for fn in self._extra_undo:
            fn()
        self._extra_undo.clear()
        for owner, name, had, old in reversed(self._undo):
            if had:
                setattr(owner, name, old)
            else:
                with contextlib.suppress(AttributeError):
                    delattr(owner, name)
        self._undo.clear()
        for h in self._handles + self._global_fwd:
            h.remove()
        self._handles.clear()
        self._global_fwd.clear()
        while self._autocast_ctx:
            with contextlib.suppress(Exception):
                self._autocast_ctx.pop().__exit__(None, None, None)

    # ---------------------------------------------------------------------------- step boundaries
    def boundary(self, now: float) -> None:
        """Called where a new step may begin. Closes the current step if an optimizer has stepped in it."""
        if self.step_start is None:
            self._begin(now)
            return
        if not self.stepped:
            return
        self._close(now)

    def _begin(self, now: float) -> None:
        self.step_start = now
        self.data = self.h2d = self.sync = self.fwd = self.bwd = self.opt = 0.0
        self.n_syncs = 0
        self.step_loss = None
        self._h2d_events = []
        self.stepped = set()
        self._faults0 = minor_page_faults()
        self._depth = 0
        self._last_site = None
        self._last_code = None
        self._last_sync_end = -1.0  # no loop spans a step boundary
        self._eval_seen = False
        if not self.warm_done and len(self.records) >= self.cfg.warmup:
            self._warmup_finished()

    def _close(self, now: float) -> None:
        assert self.step_start is not None
        n = len(self.records)
        total = now - self.step_start
        rec = {
            "index": n,
            "start_s": self.step_start - self.t0,
            "total_s": total,
            "data_wait_s": self.data,
            "h2d_s": self.h2d,
            "sync_s": self.sync,
            "forward_s": self.fwd,
            "backward_s": self.bwd,
            "optimizer_s": self.opt,
            "syncs": self.n_syncs,
            "minor_faults": minor_page_faults() - self._faults0,
            "warmup": n < self.cfg.warmup,
            "traced": bool(self.tracer is not None and self.tracer.active),
            "eval": self._eval_seen,
        }
        self.records.append(rec)
        self.losses.append(self.step_loss)
        self.h2d_events.append(self._h2d_events)
        if self.tracer is not None:
            self.tracer.step()
        if n == 0 and self._global_fwd and self.captured.models:
            self._drop_global_forward_hooks()
        if not self._cuda_debug_on and n < 2 and torch.cuda.is_initialized():
            self._install_cuda_sync_debug()
        if now - self._last_flush > self._flush_every:
            self._last_flush = now
            self.flush("running")
        self._begin(now)
        done = len(self.records) - self.cfg.warmup
        if not self.cfg.full and done >= self.cfg.steps:
            raise StopProfiling(f"measured {done} steps")

    def close_pending(self) -> None:
        """At the end of the script: a step whose optimizer stepped but no next step began."""
        if self.step_start is not None and self.stepped and self.last_opt_post is not None:
            with contextlib.suppress(StopProfiling):
                self._close(self.last_opt_post)

    def _warmup_finished(self) -> None:
        self.warm_done = True
        if self.cfg.callback and self.cfg.callback_at == "step":
            self.run_callback()
        if self.cfg.trace and self.tracer is None:
            from pitstop.profile.trace import StepTracer

            self.tracer = StepTracer(self.cfg.out_dir, active=min(3, max(1, self.cfg.steps - 1)))
            self.tracer.start()

    def run_callback(self) -> None:
        from pitstop.factory import load_object

        spec = self.cfg.callback
        self.cfg.callback = None  # once
        try:
            fn = load_object(spec or "")
            result = fn(self.captured)
            json.dumps(result)
            self.callback_result = result
        except StopProfiling:
            raise
        except TypeError as e:
            if "JSON serializable" in str(e):
                self.callback_error = f"callback {spec} returned a value that is not JSON-serialisable: {e}"
            else:
                self.callback_error = f"callback {spec} failed: {type(e).__name__}: {e}"
        except Exception as e:
            self.callback_error = f"callback {spec} failed: {type(e).__name__}: {e}"
        raise StopProfiling(f"callback {spec} done")

    # --------------------------------------------------------------------------------- optimizer
    def _opt_pre(self, opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        now = clock()
        if self.step_start is None:
            self._begin(now)
        elif id(opt) in self.stepped:
            self._close(now)
        self._opt_t0 = clock()

    def _opt_post(self, opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        now = clock()
        self.opt += now - self._opt_t0
        self.stepped.add(id(opt))
        self.last_opt_post = now

    # ---------------------------------------------------------------------------------- forward
    def _global_pre(self, module: torch.nn.Module, args: tuple[Any, ...]) -> Any:
        if torch.compiler.is_compiling():
            return None
        depth = self._depth
        self._depth = depth + 1
        if depth == 0 and id(module) not in self._model_ids and _has_params(module):
            self._add_model(module)
            new = self._model_pre(module, args, {})
            if new is not None:
                return new[0]
        return None

    def _global_post(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if torch.compiler.is_compiling():
            return
        self._depth = max(0, self._depth - 1)

    def _drop_global_forward_hooks(self) -> None:
        for h in self._global_fwd:
            h.remove()
        self._global_fwd = []

    def _add_model(self, module: torch.nn.Module) -> None:
        self._model_ids.add(id(module))
        self.captured.models.append(module)
        self._handles.append(module.register_forward_pre_hook(self._model_pre, with_kwargs=True))
        self._handles.append(module.register_forward_hook(self._model_post, with_kwargs=True))
        self.model_facts[id(module)] = {"first_location": user_location(3)}
        ov = self.cfg.overrides
        if ov.channels_last:
            self._channels_last(module)
        if ov.compile:
            try:
                module.compile()
            except Exception as e:  # compile setup failed: stay eager, say so
                self.compile_error = f"{type(e).__name__}: {e}"

    def _channels_last(self, module: torch.nn.Module) -> None:
        if any(isinstance(p, torch.nn.parameter.UninitializedParameter) for p in module.parameters()):
            self._pending_cl.add(id(module))  # lazy layers: convert after the forward that creates them
            return
        self._pending_cl.discard(id(module))
        try:
            module.to(memory_format=torch.channels_last)
        except Exception as e:
            self.override_errors.append(f"channels_last: {type(e).__name__}: {e}")

    def _model_pre(self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if torch.compiler.is_compiling():
            return None
        now = clock()
        self.boundary(now)
        self._depth = 1 if self._global_fwd else 0
        self._fwd_t0 = now
        if not torch.is_grad_enabled():
            self._eval_seen = True  # a validation pass ran inside this step: the timeline can set it apart
        else:
            self.captured.last_inputs = (args, kwargs)
        facts = self.model_facts.get(id(module))
        if facts is not None and "autocast" not in facts:
            facts.update(_forward_facts(module, args, kwargs))
        ov = self.cfg.overrides
        changed = False
        if ov.channels_last:
            args = tuple(_to_channels_last(a) for a in args)
            kwargs = {k: _to_channels_last(v) for k, v in kwargs.items()}
            changed = True
        if ov.autocast:
            dev = _module_device_type(module)
            ctx = torch.autocast(dev, dtype=getattr(torch, ov.autocast))
            ctx.__enter__()
            self._autocast_ctx.append(ctx)
        return (args, kwargs) if changed else None

    def _model_post(self, module: torch.nn.Module, args: Any, kwargs: Any, output: Any) -> Any:
        if torch.compiler.is_compiling():
            return None
        dt = clock() - self._fwd_t0
        self.fwd += dt
        self.totals["forward_s"] += dt
        self.totals["forwards"] += 1
        if self._pending_cl and id(module) in self._pending_cl:
            self._channels_last(module)
        if self._autocast_ctx:
            self._autocast_ctx.pop().__exit__(None, None, None)
            return _float_outputs(output)
        return None

    # ------------------------------------------------------------------------------------ output
    def sync_site_rows(self) -> list[dict[str, Any]]:
        """One row per (location, method); several call sites on one line add up."""
        rows: dict[tuple[str, str], dict[str, Any]] = {}
        for (where, _at, method), (count, time_s, measured, loop_s, code, line, *_) in self._sites.items():
            at = where if isinstance(where, str) else location(code.co_filename, line)
            row = rows.setdefault(
                (at, method),
                {
                    "location": at,
                    "method": method,
                    "count": 0,
                    "time_s": 0.0,
                    "measured_count": 0,
                    "loop_gap_s": 0.0,
                },
            )
            row["count"] += count
            row["time_s"] += time_s
            row["measured_count"] += measured
            row["loop_gap_s"] += loop_s
        return list(rows.values())

    def flush(self, status: str, **extra: Any) -> None:
        if self.flush_path is None:
            return
        t = clock()
        data = self.snapshot(status, final=False)
        data.update(extra)
        write_json_atomic(self.flush_path, data)
        # a long --full run grows the record: flush less often so writing it stays under ~2% of the time
        if len(self.records) >= 1000:
            self._flush_every = max(FLUSH_EVERY_S, 50 * (clock() - t))

    def snapshot(self, status: str, final: bool = True) -> dict[str, Any]:
        facts = []
        for m in self.captured.models:
            f = dict(self.model_facts.get(id(m), {}))
            if final:
                f.update(model_facts(m))
            facts.append(f)
        usage = resource.getrusage(resource.RUSAGE_SELF)
        memory: dict[str, Any] = {"peak_rss_bytes": usage.ru_maxrss * 1024}
        dev = self.captured.device
        if final and dev is not None and dev.type == "cuda":
            with contextlib.suppress(Exception):
                memory["cuda_peak_allocated_bytes"] = torch.cuda.max_memory_allocated(dev)
                memory["cuda_peak_reserved_bytes"] = torch.cuda.max_memory_reserved(dev)
        return {
            "version": 1,
            "status": status,
            "warmup": self.cfg.warmup,
            "steps": self.records,
            "totals": dict(self.totals),
            "sync_sites": self.sync_site_rows(),
            "loaders": [c.settings() for c in self.captured.loaders],
            "models": facts,
            "optimizers": self.optimizer_facts,
            "device": str(dev) if dev is not None else None,
            "torch": torch_facts() if final else {},  # at the end only: keep the periodic flush cheap
            "memory": memory,
            "callback_result": self.callback_result,
            "callback_error": self.callback_error,
            "compile_error": self.compile_error,
            "override_errors": self.override_errors,
            "host_memory": str(kept()) if kept() is not None else None,  # set by the script or an override
            "gpu_util": self.gpu_sampler.summary(self.records) if self.gpu_sampler else None,
            "wall_s": clock() - self.t0,
            "pid": os.getpid(),
        }


# ----------------------------------------------------------------------------------------- wrappers


def _make_dl_init(inst: Instrumentation, orig: Any) -> Any:
    @functools.wraps(orig)
    def __init__(self: DataLoader, *args: Any, **kwargs: Any) -> None:
        if getattr(self, "_pitstop_in_init", False):  # a subclass calling super().__init__ twice
            return orig(self, *args, **kwargs)
        try:
            bound = _DL_SIG.bind(self, *args, **kwargs)
        except TypeError:
            return orig(self, *args, **kwargs)  # let DataLoader raise its own message
        kw = dict(bound.arguments)
        kw.pop("self", None)
        kw.update(kw.pop("kwargs", {}) or {})
        applied, skipped = _apply_loader_overrides(kw, inst.cfg.overrides.dataloader)
        self._pitstop_in_init = True
        try:
            orig(self, **kw)
        finally:
            self._pitstop_in_init = False
        cap = CapturedLoader(
            loader=self,
            kwargs=kw,
            dataset=kw.get("dataset"),
            location=user_location(2),
            applied=applied,
            skipped=skipped,
        )
        self._pitstop_captured = cap
        inst.captured.loaders.append(cap)
        if inst.cfg.callback and inst.cfg.callback_at == "loader":
            inst.run_callback()

    return __init__


def _apply_loader_overrides(
    kw: dict[str, Any], forced: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, str]]:
    applied: dict[str, Any] = {}
    skipped: dict[str, str] = {}
    if not forced:
        return applied, skipped
    if "batch_size" in forced:
        if kw.get("batch_sampler") is not None:
            skipped["batch_size"] = "the script passes a batch_sampler"
        else:
            kw["batch_size"] = applied["batch_size"] = forced["batch_size"]
    for key in ("num_workers", "pin_memory"):
        if key in forced:
            kw[key] = applied[key] = forced[key]
    workers = kw.get("num_workers", 0) or 0
    for key in ("persistent_workers", "prefetch_factor"):
        if key in forced:
            if workers > 0:
                kw[key] = applied[key] = forced[key]
            else:
                skipped[key] = "needs num_workers > 0"
    if workers == 0:  # DataLoader rejects these without workers
        kw["prefetch_factor"] = None
        kw["persistent_workers"] = False
    return applied, skipped


def _make_dl_iter(inst: Instrumentation, orig: Any) -> Any:
    @functools.wraps(orig)
    def __iter__(self: DataLoader) -> Any:
        it = orig(self)
        cap = getattr(self, "_pitstop_captured", None)
        if cap is not None and isinstance(it, _BaseDataLoaderIter):
            it._pitstop_captured = cap
            it._pitstop_first = True
            cap.iterators += 1
            inst._iterators.append(weakref.ref(it))
        return it

    return __iter__


def _make_next(inst: Instrumentation, orig: Any) -> Any:
    @functools.wraps(orig)
    def __next__(self: _BaseDataLoaderIter) -> Any:
        if inst.in_next:
            return orig(self)
        t = clock()
        inst.boundary(t)
        inst.in_next = inst.in_sync = True  # syncs inside data loading are data wait, not syncs
        try:
            batch = orig(self)
        finally:
            inst.in_next = inst.in_sync = False
            dt = clock() - t
            inst.data += dt
            inst.totals["data_wait_s"] += dt
            cap = getattr(self, "_pitstop_captured", None)
            if cap is not None:
                cap.wait_s += dt
                if getattr(self, "_pitstop_first", False):
                    self._pitstop_first = False
                    cap.first_batch_s.append(dt)
        inst.totals["batches"] += 1
        if cap is not None:
            cap.batches += 1
        inst.captured.last_batch = batch
        return batch

    return __next__


def _make_opt_init(inst: Instrumentation, orig: Any) -> Any:
    @functools.wraps(orig)
    def __init__(self: torch.optim.Optimizer, params: Any, defaults: dict[str, Any]) -> None:
        impl = inst.cfg.overrides.optimizer_impl
        applied = None
        if impl and isinstance(defaults, dict) and impl in defaults:
            defaults = dict(defaults)
            defaults[impl] = True
            other = "fused" if impl == "foreach" else "foreach"
            if other in defaults:
                defaults[other] = None if other == "fused" else False
            applied = impl
        orig(self, params, defaults)
        inst.captured.optimizers.append(self)
        inst.optimizer_facts.append(
            {
                "type": type(self).__name__,
                "location": user_location(3),
                "foreach": defaults.get("foreach") if isinstance(defaults, dict) else None,
                "fused": defaults.get("fused") if isinstance(defaults, dict) else None,
                "supports_foreach": isinstance(defaults, dict) and "foreach" in defaults,
                "supports_fused": isinstance(defaults, dict) and "fused" in defaults,
                "override": applied,
                "impl": None,  # filled in at the end (needs the params' device)
            }
        )

    return __init__


def _make_to(inst: Instrumentation, orig: Any) -> Any:
    @functools.wraps(orig)
    def to(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if inst.in_next or not self.is_cpu:
            return orig(self, *args, **kwargs)
        dev = inst.captured.device
        start = None
        if dev is not None and dev.type == "cuda":
            # Time the copy on the GPU without a sync: the events are read once, at the end.
            start = torch.cuda.Event(enable_timing=True)
            start.record()
        t = clock()
        out = orig(self, *args, **kwargs)
        if isinstance(out, torch.Tensor) and not out.is_cpu:
            inst.h2d += clock() - t
            if start is not None:
                end = torch.cuda.Event(enable_timing=True)
                end.record()
                inst._h2d_events.append((start, end))
            if dev is None:
                inst.captured.device = out.device
                if out.device.type == "cuda":
                    inst.start_gpu_sampler(out.device)
                    inst._install_cuda_sync_debug()
        return out

    return to


def _make_backward(inst: Instrumentation, orig: Any) -> Any:
    @functools.wraps(orig)
    def backward(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        t = clock()
        if inst.step_loss is None:
            inst.step_loss = self.detach()
        try:
            return orig(self, *args, **kwargs)
        finally:
            dt = clock() - t
            inst.bwd += dt
            inst.totals["backward_s"] += dt

    return backward


def _has_params(module: torch.nn.Module) -> bool:
    return next(module.parameters(), None) is not None


def _module_device_type(module: torch.nn.Module) -> str:
    p = next(module.parameters(), None)
    return p.device.type if p is not None else "cpu"


def _to_channels_last(v: Any) -> Any:
    if isinstance(v, torch.Tensor) and v.dim() == 4 and v.is_floating_point():
        return v.contiguous(memory_format=torch.channels_last)
    return v


def _float_outputs(out: Any) -> Any:
    if isinstance(out, torch.Tensor):
        return out.float() if out.dtype in (torch.bfloat16, torch.float16) else out
    if isinstance(out, tuple) and not hasattr(out, "_fields"):
        return tuple(_float_outputs(o) for o in out)
    if isinstance(out, list):
        return [_float_outputs(o) for o in out]
    return out


def _tensors(obj: Any, depth: int = 0) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if depth > 3:
        return []
    if isinstance(obj, list | tuple):
        return [t for o in obj for t in _tensors(o, depth + 1)]
    if isinstance(obj, dict):
        return [t for o in obj.values() for t in _tensors(o, depth + 1)]
    return []


def _forward_facts(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    dev = _module_device_type(module)
    inputs = _tensors((args, kwargs))
    autocast = torch.is_autocast_enabled(dev)
    return {
        "autocast": autocast,
        "autocast_dtype": str(torch.get_autocast_dtype(dev)).replace("torch.", "") if autocast else None,
        "input_shapes": [list(t.shape) for t in inputs[:4]],
        "input_dtypes": sorted({str(t.dtype).replace("torch.", "") for t in inputs}),
        "input_channels_last": any(
            t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last) and not t.is_contiguous()
            for t in inputs
        ),
    }


def shutdown_loader_workers(inst: Instrumentation) -> None:
    """Stop DataLoader worker processes the stopped script left behind (a for-loop left by an exception)."""
    for ref in inst._iterators:
        it = ref()
        if it is not None and hasattr(it, "_shutdown_workers"):
            with contextlib.suppress(Exception):
                it._shutdown_workers()


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    from pitstop.findings import jsonable

    tmp.write_text(json.dumps(jsonable(data), allow_nan=False))
    os.replace(tmp, path)
