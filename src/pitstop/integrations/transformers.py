"""``pitstop.integrations.transformers.PitstopCallback``: profile steps N..M of an HF ``Trainer.train``.

    trainer = Trainer(model, args, train_dataset=ds, callbacks=[PitstopCallback(start_step=10, stop_step=40)])

The report (the same findings as ``pitstop profile``) lands in ``args.output_dir`` as
``pitstop-profile.json`` / ``.html``; the step breakdown (``pitstop/step_ms``, ``pitstop/data_wait_ms``
..., ``pitstop/mfu`` when measured) is added to the next log event, which every reporting integration
(TensorBoard, W&B, ...) and ``state.log_history`` receive. Measures on the main process.
"""

from __future__ import annotations

import sys
from typing import Any

from pitstop.findings import Report
from pitstop.integrations.window import FitWindow, metrics_of

try:
    from transformers import TrainerCallback
    from transformers.trainer_callback import CallbackHandler
except ImportError as e:
    raise ImportError(
        "pitstop.integrations.transformers needs transformers: pip install transformers (pitstop itself does not)"
    ) from e


class PitstopCallback(TrainerCallback):
    """Profile optimizer steps ``start_step`` .. ``stop_step`` (end exclusive) of ``Trainer.train``.

    stop: end training once the report is made (``control.should_training_stop``).

    HF calls no callback when ``train()`` raises: call ``close(exc)`` then (e.g. in an ``except``) to
    remove the instrumentation and get the report of what was measured.
    """

    def __init__(
        self, start_step: int = 5, stop_step: int = 35, *, probes: bool = True, stop: bool = False
    ) -> None:
        self.window = FitWindow(start_step, stop_step, probes=probes)
        self.stop = stop
        self.metrics: dict[str, float] = {}  # waiting for the next log event

    @property
    def report(self) -> Report | None:
        return self.window.report

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not state.is_world_process_zero or self.window.measuring:
            return
        _run_first(self, sys._getframe(1).f_locals.get("self"))
        model = kwargs.get("model")
        self.window.begin(f"transformers: {type(model).__name__}")

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        last = state.max_steps and state.global_step >= state.max_steps
        if self.window.ready or (last and self.window.measuring):
            self._finish(args)
            control.should_log = bool(self.metrics)
            if self.stop:
                control.should_training_stop = True
        return control

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._finish(args)
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

    def _finish(self, args: Any) -> None:
        if not self.window.measuring:
            return
        report = self.window.end(args.output_dir)
        self.metrics = metrics_of(report) if report is not None else {}


def _run_first(cb: PitstopCallback, handler: Any) -> None:
    """Put the callback before the reporting integrations, so they log the metrics it adds to a log
    event. Moving the current element to the front of the list being iterated skips and repeats none."""
    if isinstance(handler, CallbackHandler) and cb in handler.callbacks:
        handler.callbacks.remove(cb)
        handler.callbacks.insert(0, cb)
