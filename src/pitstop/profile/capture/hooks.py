"""Instrumentation inside the user's process: where each step's time goes, and what the script built.

Installed by ``pitstop.profile.process.bootstrap`` before the user's script runs, removed before it exits.
``Instrumentation`` holds the run's state and the points every probe calls: ``boundary`` (a step may
begin here), ``data_begin/end``, ``copy_begin/end``, ``forward_begin/end``, ``backward_begin/end``,
``optimizer_begin/end``. The probes themselves live beside it:

- ``stepclock``: step boundaries (by optimizer step, or by backward for loops without an optimizer) and
  exclusive phase times, so a step's parts add up to it.
- ``loaders``: ``DataLoader.__init__/__iter__`` and ``_BaseDataLoaderIter.__next__`` (data wait).
- ``models``: global module forward hooks (top-level forwards, the script's models).
- ``torchcalls``: ``Tensor.to/cuda`` (host-to-device copies; CUDA events on CUDA, read at the end),
  ``Tensor.backward``/``torch.autograd.backward/grad``, ``Optimizer.__init__``, optimizer step hooks.
- ``syncs``: ``Tensor.item/tolist/...`` host syncs at the user's line; on CUDA,
  ``torch.cuda.set_sync_debug_mode("warn")`` adds syncs inside torch calls.

Nothing is stored on the script's objects, so they pickle, deepcopy, save, script, export and compile as
without pitstop; ``uninstall`` undoes every patch and hook. A probe never prints: everything lands in
``Instrumentation.snapshot()``, written to a JSON file by the bootstrap, periodically and at exit.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from pitstop.profile.capture import gpu_memory
from pitstop.profile.capture.device_time import DeviceTimer
from pitstop.profile.capture.facts import GpuSampler
from pitstop.profile.capture.loaders import LoaderTables, install_loader_patches
from pitstop.profile.capture.models import NARROW_AFTER, ModelHooks, call_kwargs, forward_facts
from pitstop.profile.capture.patches import Patches, install_cuda_sync_debug, make_inert
from pitstop.profile.capture.snapshot import measurements
from pitstop.profile.capture.stepclock import (
    BACKWARD,
    BY_BACKWARD,
    CLOSURE,
    DATA,
    FORWARD,
    H2D,
    OPTIMIZER,
    StepClock,
)
from pitstop.profile.capture.syncs import SyncSites, SyncWrappers
from pitstop.profile.capture.torchcalls import install_torch_patches
from pitstop.profile.capture.where import user_location
from pitstop.profile.record.captured import Captured, CapturedLoader
from pitstop.profile.record.jsonfile import write_json_atomic
from pitstop.profile.record.measurements import Measurements
from pitstop.profile.record.overrides import Overrides
from pitstop.profile.record.parts import Totals
from pitstop.profile.record.timeline import STEPS_LOG, StepsLog
from pitstop.recipes.host_memory import keep_host_memory, minor_page_faults

__all__ = ["Captured", "CapturedLoader", "Config", "Instrumentation", "StopProfiling"]

clock = time.perf_counter
# how often measurements reach the parent while steps run (what a SIGKILL leaves): every second, or less
# often where one flush takes more than FLUSH_SHARE of the time between flushes (a run's snapshot grows
# with its sync sites and loaders: 3-4 ms on item_sync.py, 0.3% of every step's time at one a second).
# The env var fixes the interval (tests and debugging).
_FLUSH_ENV = os.environ.get("PITSTOP_PROFILE_FLUSH_S")
FLUSH_EVERY_S = float(_FLUSH_ENV or "1.0")
FLUSH_SHARE = None if _FLUSH_ENV else 0.001
FLUSH_RETRY_MAX_S = 60.0  # a flush that failed (folder gone, disk full) is retried at most this far apart


class StopProfiling(BaseException):
    """Raised inside the user's script to stop it after the measured steps (or after a callback).

    A BaseException so a script's ``except Exception`` does not swallow it; the bootstrap reports a clean stop.
    """


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
    probes: bool = True  # measured what-ifs at the end (pitstop.profile.probe.probes)
    # called instead of raising StopProfiling after the measured steps (in-process profiling keeps training)
    on_done: Any = None


class Instrumentation:
    """One per process. Probes call its points; ``snapshot()`` is what the parent reads."""

    def __init__(self, config: Config) -> None:
        self.cfg = config
        self.callback_requested = bool(config.callback)
        self.captured = Captured(out_dir=config.out_dir)
        self.t0 = clock()
        self.clock = StepClock()
        self.syncs = SyncSites(self.clock.phases)
        self.sync_wrappers = SyncWrappers(self.syncs)
        self.loaders = LoaderTables()
        self.models = ModelHooks(self)
        self.patches = Patches()
        self._extra_undo: list[Any] = []
        self.in_next = False  # inside DataLoader.__next__
        self.in_backward = False  # inside a top-level backward call
        # train_forwards: top-level forwards with grad on and the module in training mode (MFU's passes)
        self.counts = {"batches": 0, "forwards": 0, "train_forwards": 0, "backwards": 0, "optimizer_steps": 0}
        # the current step
        self.step_loss: torch.Tensor | None = None
        # the step's CUDA copy events; None until one (not a list a step that the cyclic GC walks)
        self._h2d_events: list[tuple[Any, Any]] | None = None
        self._faults0 = 0
        self._eval_seen = False
        # the run
        self.records: list[dict[str, Any]] = []
        self.losses: list[torch.Tensor | None] = []
        self.h2d_events: list[list[tuple[Any, Any]] | None] = []
        self.warm_done = False
        self.callback_result: Any = None
        self.callback_error: str | None = None
        self.compile_error: str | None = None
        self.model_facts: dict[int, dict[str, Any]] = {}
        self.optimizer_facts: list[dict[str, Any]] = []
        self.tracer: Any = None
        self.gpu_sampler: GpuSampler | None = None
        self.device_timer = DeviceTimer()  # CUDA events at phase boundaries (pitstop.profile.capture.device_time)
        # told of each top-level backward while its ``armed`` is set (a rank's DDP all-reduce: ddp_timers)
        self.backward_listener: Any = None
        self.oom: dict[str, Any] | None = None  # CUDA OOM snapshot summary (pitstop.profile.capture.gpu_memory)
        self._last_flush = clock()
        self._flush_gap = FLUSH_EVERY_S  # seconds between periodic flushes (FLUSH_SHARE stretches it)
        self.flush_error: str | None = None  # why the last periodic flush that failed could not be written
        self.flush_path: Path | None = None
        self._steps_log: StepsLog | None = None  # the flushed records, each written once
        self._cuda_debug_on = False
        self.override_errors: list[str] = []

    @property
    def warm_done(self) -> bool:
        return self._warm_done

    @warm_done.setter
    def warm_done(self, value: bool) -> None:
        self._warm_done = self.syncs.measuring = value

    @property
    def worker_pools(self) -> list[tuple[Any, list[Any], CapturedLoader]]:
        """(iterator ref, worker processes, loader) of every DataLoader iterator that started workers."""
        return self.loaders.pools

    def start_gpu_sampler(self, device: torch.device) -> None:
        if self.gpu_sampler is None:
            self.gpu_sampler = GpuSampler(device.index or 0, self.t0)
            self.gpu_sampler.start()

    # ----------------------------------------------------------------------------------- install
    def install(self) -> None:
        ov = self.cfg.overrides
        if ov.keep_host_memory:
            kept_now = keep_host_memory()
            if not kept_now.applied:
                self.override_errors.append(f"keep_host_memory: {kept_now.detail}")
        install_loader_patches(self, self.patches, self.loaders)
        install_torch_patches(self, self.patches)
        self.sync_wrappers.install(self.patches)
        self.models.install(self.patches)

    def uninstall(self, keep_hooks: bool = False) -> None:
        """Undo every patch and hook; the script's objects and torch are as they were before install.
        ``keep_hooks``: the hook handles stay registered (``detach``), for a later ``uninstall``."""
        for fn in self._extra_undo:
            fn()
        self._extra_undo.clear()
        self.patches.undo(keep_handles=keep_hooks)
        self.sync_wrappers.uninstalled()
        self.models.uninstall(keep_handles=keep_hooks)

    def detach(self) -> None:
        """Stop measuring while the script runs on; safe inside one of our hooks. torch may be iterating
        the dict that holds the hook being run, so hooks become no-ops here and ``uninstall`` removes them."""
        make_inert([*self.patches.handles, *self.models.handles])
        self.clock.step_start = None  # the step in progress is not measured
        self.uninstall(keep_hooks=True)

    def adopt_loader(self, loader: Any, where: str | None = None) -> CapturedLoader:
        """A DataLoader built before ``install`` (by a trainer): measured from its next iterator on."""
        cap = self.loaders.loaders.get(id(loader))
        if cap is None:
            cap = CapturedLoader(loader=loader, kwargs={}, dataset=loader.dataset, location=where)
            self.loaders.loaders[id(loader)] = cap
            self.captured.loaders.append(cap)
        return cap

    def _install_cuda_sync_debug(self) -> None:
        if not self._cuda_debug_on and torch.cuda.is_initialized():
            self._cuda_debug_on = True  # tried once: a torch without the debug mode is not asked again
            # warn mode switched off on steps not sampled, only once it is on
            self.syncs.cuda_debug = install_cuda_sync_debug(self.record_cuda_sync, self.patches, self._extra_undo)  # fmt: skip

    def record_cuda_sync(self) -> None:
        """One sync reported by torch's sync debug mode, counted at the user's line."""
        self.syncs.record_cuda_sync(user_location)

    # ---------------------------------------------------------------------------- step boundaries
    def boundary(self, now: float) -> None:
        """Called where a new step may begin: closes the current step if it holds a step's work, but not
        with grad off (a sampling callback or validation pass after the step is booked to that step)."""
        if self.models.direct_model is not None:  # a model.forward(x) call: it ended before
            self.models.end_direct()
        if self.clock.step_start is None:
            self._begin(now)
        elif self.clock.should_close() and torch.is_grad_enabled():
            self.close_step(now)

    def _begin(self, now: float, faults: int | None = None) -> None:
        """A step begins at ``now``; ``faults``: the page-fault count ``close_step`` just read there (its
        phases were split there too), so the boundary costs one ``getrusage``, not two."""
        self.clock.begin(now, split=faults is None)
        self.step_loss = None
        self._h2d_events = None
        self._faults0 = minor_page_faults() if faults is None else faults
        self._eval_seen = False
        self.syncs.new_step(len(self.records) - self.cfg.warmup)
        if not self._warm_done and len(self.records) >= self.cfg.warmup:
            self._warmup_finished()

    def close_step(self, now: float) -> None:
        """End the current step at ``now``, record it, begin the next; stop after the measured steps."""
        n = len(self.records)
        faults = minor_page_faults()
        start = self.clock.step_start or now
        rec = self.clock.times(now)  # the phases and total_s, in a fresh dict: the record grows from it
        tracer = self.tracer
        rec["index"] = n
        rec["start_s"] = start - self.t0
        rec["minor_faults"] = faults - self._faults0
        rec["warmup"] = n < self.cfg.warmup
        rec["traced"] = tracer is not None and bool(tracer.active)
        rec["eval"] = self._eval_seen
        self.syncs.close_step(rec)  # the step's sync count (estimated where the step was not sampled)
        self.records.append(rec)
        self.losses.append(self.step_loss)
        self.h2d_events.append(self._h2d_events)
        device = self.captured.device
        if device is not None or self.device_timer.enabled:  # (no device yet: CPU, nothing to time)
            self.device_timer.close_step(n, now, device)
        if tracer is not None:
            tracer.step(now, n)
        if not self._cuda_debug_on and n < 2 and torch.cuda.is_initialized():
            self._install_cuda_sync_debug()
        if now - self._last_flush > self._flush_gap:
            self._last_flush = now
            self._periodic_flush()
        self._begin(now, faults)
        done = len(self.records) - self.cfg.warmup
        if not self.cfg.full and done >= self.cfg.steps:
            if self.cfg.on_done is not None:
                return self.cfg.on_done()
            raise StopProfiling(f"measured {done} steps")

    def _periodic_flush(self) -> None:
        """The flush from inside the script's loop. A write that fails (the output folder removed, the
        disk full) must not stop the script: the last such error is kept as ``flush_error`` for the record,
        and the next try waits twice as long (up to ``FLUSH_RETRY_MAX_S``)."""
        took = clock()
        try:
            self.flush("running")
        except OSError as e:
            self.flush_error = f"{type(e).__name__}: {e}"
            self._flush_gap = min(2 * self._flush_gap, FLUSH_RETRY_MAX_S)
            return
        if FLUSH_SHARE:
            self._flush_gap = max(FLUSH_EVERY_S, (clock() - took) / FLUSH_SHARE)

    def close_pending(self) -> None:
        """At the end of the script: a step whose work is done (optimizer step, backward) but no next
        step began."""
        end = self.clock.pending_end()
        if end is not None:
            with contextlib.suppress(StopProfiling):
                self.close_step(end)

    def _drop_records(self) -> None:
        """The steps so far were micro-steps of a gradient-accumulation loop: measure afresh."""
        self.records.clear()
        self.losses.clear()
        self.h2d_events.clear()
        self.warm_done = False
        self.syncs.reset_measured()

    def _warmup_finished(self) -> None:
        self.warm_done = True
        gpu_memory.stop_history()  # allocation stacks cost per allocation: not in the measured steps
        if self.cfg.callback and self.cfg.callback_at == "step":
            self.run_callback()
        if self.cfg.trace and self.tracer is None:
            from pitstop.profile.capture.trace import StepTracer

            self.tracer = StepTracer(
                self.cfg.out_dir, active=min(3, max(1, self.cfg.steps - 1)), phases=self.clock.phases
            )
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

    # ---------------------------------------------------------------------------- phase points
    def loader_built(self, cap: CapturedLoader) -> None:
        self.captured.loaders.append(cap)
        if self.cfg.callback and self.cfg.callback_at == "loader":
            self.run_callback()

    def data_begin(self, now: float) -> None:
        self.in_next = self.syncs.busy = True  # syncs inside data loading are data wait, not syncs
        self.clock.phases.enter(DATA, now)

    def data_end(self, now: float) -> None:
        self.clock.phases.exit(DATA, now)
        self.in_next = self.syncs.busy = False
        self.counts["batches"] += 1

    def batch_loaded(self, batch: Any) -> None:
        self.captured.last_batch = batch
        if self.device_timer.enabled:
            self.device_timer.mark("data_ready", clock())

    def copy_begin(self, now: float) -> None:
        self.clock.phases.enter(H2D, now)

    def copy_end(self, now: float, device: torch.device | None, events: Any = None) -> None:
        """A ``Tensor.to`` ended; ``device`` is where the tensor went (None: it stayed on the CPU)."""
        if device is None:
            self.clock.phases.cancel(H2D)
            return
        self.clock.phases.exit(H2D, now)
        if events is not None:
            if self._h2d_events is None:
                self._h2d_events = []
            self._h2d_events.append(events)
        if self.captured.device is None:
            self.captured.device = device
            if device.type == "cuda":
                self.start_gpu_sampler(device)
                if not self.warm_done:  # allocation stacks until the warm-up ends
                    gpu_memory.start_history()
                self._install_cuda_sync_debug()

    def forward_begin(self, module: torch.nn.Module, args: tuple[Any, ...]) -> Any:
        """A top-level forward starts; returns replacement args (input overrides) or None."""
        now = clock()
        self.boundary(now)
        start = clock()
        self.clock.phases.enter(FORWARD, start)
        if self.device_timer.enabled:  # (CUDA only: a CPU step skips the call)
            self.device_timer.mark("fwd_start", start)
        if not torch.is_grad_enabled():
            self._eval_seen = True  # a validation pass ran inside this step: the timeline can set it apart
        elif module.training:
            self.counts["train_forwards"] += 1
        facts = self.model_facts.get(id(module))
        if facts is not None and "autocast" not in facts:
            facts.update(forward_facts(module, args, call_kwargs()))
        return self.models.override_inputs(module, args) if self.models.on_inputs else None

    def forward_end(self, module: torch.nn.Module, output: Any, now: float | None = None) -> Any:
        """A top-level forward ended (at ``now``); returns a replacement output (overrides) or None."""
        now = clock() if now is None else now
        self.clock.phases.exit(FORWARD, now)
        if self.device_timer.enabled:
            self.device_timer.mark("fwd_end", now)
        self.counts["forwards"] += 1
        models = self.models
        return models.override_output(module, output) if models.pending or models.on_outputs else None

    def backward_begin(self, loss: torch.Tensor | None, now: float) -> None:
        if self.clock.mode == BY_BACKWARD and (self.clock.step_start is None or self.clock.backwards):
            self.boundary(now)  # a loop with no module call or batch fetch between its backward calls
        if self.models.direct_model is not None:
            self.models.end_direct()
        self.in_backward = True
        if self.step_loss is None and loss is not None:
            self.step_loss = loss.detach()
        self.clock.phases.enter(BACKWARD, now)
        listener = self.backward_listener
        if listener is not None and listener.armed:
            listener.backward_begin(user_location(2), now)

    def backward_end(self, now: float, failed: bool = False) -> None:
        """A top-level backward ended at ``now``; ``failed``: it raised."""
        self.clock.phases.exit(BACKWARD, now)
        if self.device_timer.enabled:
            self.device_timer.mark("bwd_end", now)
        self.in_backward = False
        self.counts["backwards"] += 1
        self.clock.backward_done(now)
        if self.backward_listener is not None:
            self.backward_listener.backward_end(failed)

    def optimizer_begin(self, opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> Any:
        """Before ``opt.step()``; a closure passed to it is wrapped so that its time is not the
        optimizer's (returns the new (args, kwargs) then, as optimizer step pre-hooks may)."""
        now = clock()
        self.clock.optimizer_started()
        if self.clock.step_start is None:
            self._begin(now)
        elif self.clock.repeats(opt):
            self.close_step(now)
        self.clock.phases.enter(OPTIMIZER, clock())
        if kwargs.get("closure") is not None:
            return args, {**kwargs, "closure": self._timed_closure(kwargs["closure"])}
        if args and callable(args[0]):
            return (self._timed_closure(args[0]), *args[1:]), kwargs
        return None

    def _timed_closure(self, closure: Any) -> Any:
        phases = self.clock.phases

        def run_closure() -> Any:
            phases.enter(CLOSURE, clock())
            try:
                return closure()
            finally:
                phases.exit(CLOSURE, clock())

        return run_closure

    def optimizer_end(self, opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        now = clock()
        self.clock.phases.exit(OPTIMIZER, now)
        if self.device_timer.enabled:
            self.device_timer.mark("opt_end", now)
        self.counts["optimizer_steps"] += 1
        if self.clock.optimizer_stepped(opt, now, self._warm_done, len(self.records)):
            self._drop_records()
        elif self._warm_done and len(self.records) >= NARROW_AFTER and not self.models.narrowed:
            self.models.narrow(self.patches)  # outside any module call: its hooks may go

    # ------------------------------------------------------------------------------------ output
    def sync_site_rows(self) -> list[dict[str, Any]]:
        return self.syncs.rows()

    def totals(self) -> Totals:
        """What ran over the whole run, steps or not (the report's evidence when no step was seen)."""
        run = self.clock.phases.run_totals()
        return Totals.from_json(
            {
                "data_wait_s": run[DATA],
                "forward_s": run[FORWARD],
                "backward_s": run[BACKWARD],
                "optimizer_s": run[OPTIMIZER],
                **self.counts,
            }
        )

    def flush(self, status: str, **extra: Any) -> None:
        """The measurements so far to ``flush_path``, the step records appended to the steps log beside it."""
        if self.flush_path is None:
            return
        data = self.snapshot(status, final=False)
        data.update(extra)
        if self._steps_log is None or self._steps_log.path.parent != self.flush_path.parent:
            self._steps_log = StepsLog(self.flush_path.with_name(STEPS_LOG))
        data["steps_count"] = self._steps_log.write(data.pop("steps"))
        data.update(steps_log=STEPS_LOG, steps_generation=self._steps_log.generation)
        write_json_atomic(self.flush_path, data)

    def snapshot(self, status: str, final: bool = True) -> dict[str, Any]:
        """The measurements record so far, as the JSON the parent reads (``capture.snapshot``)."""
        return self.record(status, final).to_json()

    def record(self, status: str, final: bool = True) -> Measurements:
        return measurements(self, status, final)
