"""``pitstop.integrations.transformers.PitstopCallback``: profile steps N..M of an HF ``Trainer.train``.

    trainer = Trainer(model, args, train_dataset=ds, callbacks=[PitstopCallback(start_step=10, stop_step=40)])

The report (the same findings as ``pitstop profile``) lands in ``args.output_dir`` as
``pitstop-profile.json`` / ``.html``; the step breakdown (``pitstop/step_ms``, ``pitstop/data_wait_ms``
..., ``pitstop/mfu`` when measured) is added to the next log event, which every reporting integration
(TensorBoard, W&B, ...) and ``state.log_history`` receive. The integrations in ``args.report_to`` that
can hold more get the export of ``pitstop.profile.present.export`` too (each step's parts, the findings table, the
headline): ``tensorboard`` (the TensorBoard callback's writer, or a writer on its folder), ``wandb`` and
``mlflow`` (their active runs); ``export=False`` leaves it out. Measures on the main process.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from pitstop.findings import Report
from pitstop.integrations.window import WindowCallback, metrics_of
from pitstop.profile.present.export import Sink, export

try:
    from transformers import TrainerCallback
    from transformers.trainer_callback import CallbackHandler
except ImportError as e:
    raise ImportError(
        "pitstop.integrations.transformers needs transformers: pip install transformers (pitstop itself does not)"
    ) from e


class PitstopCallback(WindowCallback, TrainerCallback):
    """Profile optimizer steps ``start_step`` .. ``stop_step`` (end exclusive) of ``Trainer.train``.

    stop: end training once the report is made (``control.should_training_stop``).
    export: write the step breakdown and findings to the TensorBoard, W&B and MLflow of ``report_to``.
    probes: run the measured what-ifs when the window ends.

    HF calls no callback when ``train()`` raises: call ``close(exc)`` then (e.g. in an ``except``) to
    remove the instrumentation and get the report of what was measured.
    """

    def __init__(self, start_step: int = 5, stop_step: int = 35, **options: bool) -> None:
        super().__init__(start_step, stop_step, **options)  # probes, stop, export: WindowCallback's
        self.metrics: dict[str, float] = {}  # waiting for the next log event
        self.handler: Any = None  # the Trainer's CallbackHandler: where the TensorBoard writer is

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not state.is_world_process_zero or self.window.measuring:
            return
        self.handler = sys._getframe(1).f_locals.get("self")
        _run_first(self, self.handler)
        model = kwargs.get("model")
        self.window.begin(f"transformers: {type(model).__name__}")

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        last = state.max_steps and state.global_step >= state.max_steps
        if self.window.ready or (last and self.window.measuring):
            self._finish(args, state)
            control.should_log = bool(self.metrics)
            if self.stop:
                control.should_training_stop = True
        return control

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._finish(args, state)
        if self.metrics:  # no log event is left in this run: keep them in the history at least
            state.log_history.append({**self.metrics, "step": state.global_step})
            self.metrics = {}

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kw: Any
    ) -> None:
        if self.metrics and logs is not None:
            logs.update(self.metrics)
            if state.log_history:  # Trainer.log appended its copy of the event before calling us
                state.log_history[-1].update(self.metrics)
            self.metrics = {}

    def close(self, exc: BaseException | None = None, output_dir: str | None = None) -> Report | None:
        """Finish now: instrumentation removed, report written to ``output_dir`` when given."""
        return self.window.end(output_dir, exc) if self.window.measuring else self.window.report

    def _finish(self, args: Any, state: Any) -> None:
        if not self.window.measuring:
            return
        report = self.window.end(args.output_dir)
        self.metrics = metrics_of(report) if report is not None else {}
        if report is not None and self.export:
            export(report, report_to_sinks(args, self.handler), step=state.global_step)


def report_to_sinks(args: Any, handler: Any = None) -> list[Sink | str]:
    """A sink for each of ``args.report_to`` that pitstop exports to (tensorboard, wandb, mlflow)."""
    from pitstop.profile.present.mlflow_sink import mlflow_sink
    from pitstop.profile.present.tensorboard import TensorBoardSink, tensorboard_sink
    from pitstop.profile.present.wandb_sink import wandb_sink

    report_to = args.report_to if isinstance(args.report_to, list | tuple) else [args.report_to]
    sinks: list[Sink | str] = []
    if "tensorboard" in report_to:
        callbacks = getattr(handler, "callbacks", None) or []
        tb = next((c for c in callbacks if type(c).__name__ == "TensorBoardCallback"), None)
        if getattr(tb, "tb_writer", None) is not None:
            sinks.append(TensorBoardSink(writer=tb.tb_writer))  # type: ignore[union-attr]
        else:  # the folder HF's TensorBoard callback writes to (older releases: args.logging_dir)
            log_dir = getattr(tb, "logging_dir", None) or getattr(args, "logging_dir", None)
            sinks.append(tensorboard_sink(log_dir or os.path.join(args.output_dir, "runs")))
    if "wandb" in report_to:
        sinks.append(wandb_sink())
    if "mlflow" in report_to:
        sinks.append(mlflow_sink())
    return sinks


def _run_first(cb: PitstopCallback, handler: Any) -> None:
    """Put the callback before the reporting integrations, so they log the metrics it adds to a log
    event. Moving the current element to the front of the list being iterated skips and repeats none."""
    if isinstance(handler, CallbackHandler) and cb in handler.callbacks:
        handler.callbacks.remove(cb)
        handler.callbacks.insert(0, cb)
