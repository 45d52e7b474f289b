"""Profile training inside the running process: a notebook cell, a training function, a trainer's fit.

    with pitstop.Profiler(steps=30, warmup=5) as prof:
        train()
    prof.report().ranked()      # the same Report and findings as ``pitstop profile``
    prof.to_html("profile.html")

The instrumentation is ``pitstop.profile.capture.hooks.Instrumentation``, the one ``pitstop profile`` installs in
its child process: installed on enter, removed on exit (nothing stays patched). After ``warmup + steps``
optimizer steps it stops measuring and training goes on untouched; with ``stop=True`` it raises
``StopProfiling`` instead, which the ``with`` block swallows, so the code after it runs. The probes
(fp32 vs autocast, channels_last, foreach, host memory) run on exit, on the script's own model and last
batch, as in the CLI; the model's parameters, buffers and gradients and the optimizers' state are saved
before them and put back after, so training resumes where it was. One lasting effect remains: the host
memory probe (CPU) leaves glibc malloc keeping freed memory mapped, as ``keep_host_memory`` does.

Exports, only when asked: ``tensorboard=DIR`` writes the step breakdown and findings as TensorBoard event
files, ``export=("wandb", "mlflow")`` logs them to the W&B / MLflow run already active
(``pitstop.profile.present.export``); a package not installed or no active run is said in one line.
"""

from __future__ import annotations

import functools
import json
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Literal, TypeVar

from pitstop.findings import Finding, Report, jsonable

F = TypeVar("F", bound=Callable[..., Any])
Tracker = Literal["wandb", "mlflow"]
TRACKERS: tuple[Tracker, ...] = ("wandb", "mlflow")
MAX_SAVED_BYTES = 4 << 30  # larger model+optimizer state: no probes (they would need a copy to undo)
_active: list[Profiler] = []


class Profiler:
    """Measure ``steps`` optimizer steps after ``warmup`` of the training that runs inside the block.

    stop:   raise ``StopProfiling`` after the measured steps (the block ends there) instead of training on.
    probes: run the measured what-ifs on exit (seconds, bounded); ``False`` for the bare timeline.
    label:  what the report calls the run (``meta.command``).
    tensorboard: write the report as TensorBoard event files into this folder when the block ends.
    export: also log it to the active run of these trackers (``"wandb"``, ``"mlflow"``).
    """

    def __init__(
        self,
        steps: int = 30,
        warmup: int = 5,
        *,
        stop: bool = False,
        probes: bool = True,
        label: str = "in-process",
        tensorboard: str | Path | None = None,
        export: Iterable[Tracker] = (),
    ) -> None:
        if steps < 1 or warmup < 0:
            raise ValueError("steps must be >= 1 and warmup >= 0")
        self.steps, self.warmup, self.stop, self.probes, self.label = steps, warmup, stop, probes, label
        self.tensorboard = tensorboard
        self.export = tuple(export)
        if unknown := [t for t in self.export if t not in TRACKERS]:
            raise ValueError(f"export takes {' and '.join(TRACKERS)}, not {', '.join(map(str, unknown))}")
        self._inst: Any = None
        self._t0 = 0.0
        self._report: Report | None = None
        self.done = False  # the measured steps are complete (measuring has stopped)
        self.nested = False  # inside a `pitstop profile` run, which measures instead

    # ------------------------------------------------------------------------------------ lifecycle
    def start(self) -> Profiler:
        """Install the instrumentation (what ``with`` does on enter)."""
        from pitstop.profile.capture.hooks import Config, Instrumentation

        if _active:
            raise RuntimeError("a pitstop.Profiler is already measuring in this process")
        self._report, self.done = None, False
        self.nested = _under_pitstop_profile()
        if self.nested:  # the enclosing run measures; a second layer of hooks would count twice
            return self
        cfg = Config(
            steps=self.steps,
            warmup=self.warmup,
            probes=self.probes,
            out_dir=Path.cwd(),
            on_done=None if self.stop else self._measured_all,
        )
        self._inst = Instrumentation(cfg)
        self._t0 = time.perf_counter()
        self._inst.install()
        _active.append(self)
        return self

    def _measured_all(self) -> None:
        self.done = True
        self._inst.detach()

    def finish(self, exc: BaseException | None = None) -> Report:
        """Remove the instrumentation, run the probes, build the report (what ``with`` does on exit)."""
        from pitstop.profile.capture.hooks import StopProfiling
        from pitstop.profile.process.instrumented import describe_error, finalize
        from pitstop.profile.runs.result import RunSpec, collect_data

        inst = self._inst
        if self.nested:
            self.done = True
            self._report = Report(tool="profile", error=NESTED, meta={"command": self.label})
            return self._report
        if inst is None:
            raise RuntimeError("the Profiler was not started")
        status, error, tb, code = "completed", None, None, 0
        if isinstance(exc, StopProfiling):
            status = "stopped"
        elif isinstance(exc, KeyboardInterrupt):
            status, error, code = "interrupted", "interrupted (KeyboardInterrupt)", 130
        elif exc is not None:
            status, code = "error", 1
            error, tb = describe_error(exc)
        try:
            restore = _save_state(inst) if inst.cfg.probes and status in ("completed", "stopped") else None
            if restore is None:
                inst.cfg.probes = False
            try:
                data = finalize(inst, status, stop_workers=False)
            finally:
                if restore is not None:
                    restore()
        except Exception as e:  # never lose the measurements over a failure while finishing
            inst.uninstall()
            data = inst.snapshot(status, final=False)
            data["finalize_error"] = f"{type(e).__name__}: {e}"
        finally:
            self._inst = None
            if self in _active:
                _active.remove(self)
        data.update({"status": status, "error": error, "traceback": tb, "exit_code": code})
        spec = RunSpec(command=[self.label], steps=self.steps, warmup=self.warmup, probes=self.probes)
        record = json.loads(json.dumps(jsonable(data), allow_nan=False))
        result = collect_data(spec, record, code, None, time.perf_counter() - self._t0)
        self._report = result.report()
        self.done = True
        self._export(self._report)
        return self._report

    def _export(self, report: Report) -> None:
        """The exports asked for in the constructor (none by default)."""
        from pitstop.profile.present.export import Sink, export
        from pitstop.profile.present.mlflow_sink import mlflow_sink
        from pitstop.profile.present.tensorboard import tensorboard_sink
        from pitstop.profile.present.wandb_sink import wandb_sink

        sinks: list[Sink | str] = []
        if self.tensorboard is not None:
            sinks.append(tensorboard_sink(self.tensorboard))
        sinks += [wandb_sink() if t == "wandb" else mlflow_sink() for t in self.export]
        export(report, sinks)

    @property
    def active(self) -> bool:
        return self._inst is not None

    def __enter__(self) -> Profiler:
        return self.start()

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        from pitstop.profile.capture.hooks import StopProfiling

        self.finish(exc)
        return isinstance(exc, StopProfiling) and not self.nested  # the enclosing run's stop is its own

    def __call__(self, fn: F) -> F:
        """Decorator form: each call of ``fn`` is profiled; ``fn.profiler`` (this object) has the report."""

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if self.label == "in-process":
                self.label = f"in-process: {getattr(fn, '__qualname__', fn)}"
            with self:
                return fn(*args, **kwargs)
            return None  # stopped by StopProfiling (stop=True)

        wrapper.profiler = self  # type: ignore[attr-defined]
        return wrapper  # type: ignore[return-value]

    # -------------------------------------------------------------------------------------- results
    def report(self) -> Report:
        if self._report is None:
            raise RuntimeError("no report yet: the profiled block has not finished")
        return self._report

    def ranked(self) -> list[Finding]:
        return self.report().ranked()

    def to_json(self, path: str | Path | None = None) -> str:
        """The report as JSON text (docs/report-format.md); also written to ``path`` when given."""
        from pitstop.report.jsonfmt import to_json, write_json

        if path is not None:
            write_json(self.report(), path)
        return to_json(self.report())

    def to_html(self, path: str | Path) -> Path:
        from pitstop.profile.present.render import html_blocks
        from pitstop.report.html import write_html

        return write_html(self.report(), path, html_blocks(self.report()))

    def _repr_html_(self) -> str:
        """Jupyter: the HTML report in a sandboxed iframe (its styles stay out of the notebook's)."""
        from pitstop.profile.present.render import html_blocks
        from pitstop.report.html import esc, render_html

        if self._report is None:
            return f"<p>pitstop.Profiler: {'measuring' if self.active else 'not started'}</p>"
        page = render_html(self._report, html_blocks(self._report))
        return f'<iframe sandbox srcdoc="{esc(page)}" style="width:100%;height:640px;border:0"></iframe>'


NESTED = (
    "not measured here: this process already runs under `pitstop profile`, whose report has the measurements"
)


def _under_pitstop_profile() -> bool:
    """Whether ``pitstop profile``'s instrumentation is installed (its wrapper on Tensor.backward)."""
    import torch

    code = getattr(vars(torch.Tensor).get("backward"), "__code__", None)
    return code is not None and f"pitstop{os.sep}profile" in code.co_filename


def _save_state(inst: Any) -> Callable[[], None] | None:
    """Host copies of what the probes touch (the models' parameters, buffers and grads, the optimizers'
    state: host memory, so a full GPU is not asked for more), and a function that puts them back; None
    when they are too large to copy."""
    import torch
    from torch.utils._pytree import tree_map_only

    models = list(inst.captured.models)
    optimizers = list(inst.captured.optimizers)
    tensors = [t for m in models for t in (*m.parameters(), *m.buffers())]
    if sum(t.numel() * t.element_size() for t in tensors) * 3 > MAX_SAVED_BYTES:
        return None

    def host(t: torch.Tensor) -> torch.Tensor:
        return t.detach().to("cpu", copy=True)

    with torch.no_grad():
        states = [tree_map_only(torch.Tensor, host, m.state_dict()) for m in models]
        grads = [[None if p.grad is None else host(p.grad) for p in m.parameters()] for m in models]
        modes = [[sub.training for sub in m.modules()] for m in models]
        opt_states = [tree_map_only(torch.Tensor, host, o.state_dict()) for o in optimizers]

    def restore() -> None:
        with torch.no_grad():
            for m, state, g, mode in zip(models, states, grads, modes, strict=True):
                m.load_state_dict(state)
                for p, saved in zip(m.parameters(), g, strict=True):
                    p.grad = None if saved is None else saved.to(p.device)
                for sub, training in zip(m.modules(), mode, strict=True):
                    sub.training = training
        for o, st in zip(optimizers, opt_states, strict=True):
            o.load_state_dict(st)  # moves the state back to each parameter's device

    return restore
