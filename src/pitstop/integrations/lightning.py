"""``pitstop.integrations.lightning.PitstopCallback``: profile steps N..M of a Lightning fit.

    trainer = L.Trainer(callbacks=[PitstopCallback(start_step=10, stop_step=40)])

The report (the same findings as ``pitstop profile``) lands in ``trainer.log_dir`` as
``pitstop-profile.json`` / ``.html``, and the step breakdown (``pitstop/step_ms``, ``pitstop/data_wait_ms``
..., ``pitstop/mfu`` when measured) goes to every logger the trainer has. The loggers that can hold more
get the export of ``pitstop.profile.present.export`` too (each step's parts, the findings table, the headline):
``TensorBoardLogger`` (its ``SummaryWriter``), ``WandbLogger`` (its run), ``MLFlowLogger`` (its client and
run id); ``export=False`` leaves it out. Measures on global rank 0.
"""

from __future__ import annotations

from typing import Any

from pitstop.integrations.window import WindowCallback, metrics_of
from pitstop.profile.present.export import Sink, export

try:
    from lightning.pytorch.callbacks import Callback
except ImportError:  # the older package name
    try:
        from pytorch_lightning.callbacks import Callback
    except ImportError as e:
        raise ImportError(
            "pitstop.integrations.lightning needs Lightning: pip install lightning (pitstop itself does not)"
        ) from e


class PitstopCallback(WindowCallback, Callback):
    """Profile optimizer steps ``start_step`` .. ``stop_step`` (end exclusive) of ``trainer.fit``.

    stop: end the fit once the report is made (``trainer.should_stop``).
    export: write the step breakdown and findings to the trainer's TensorBoard, W&B and MLflow loggers.
    probes: run the measured what-ifs when the window ends.
    """

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        # before the trainer builds optimizers and loaders, so they are seen as they are constructed
        if stage == "fit" and trainer.is_global_zero and not self.window.measuring:
            self.window.begin(f"lightning: {type(pl_module).__name__}")

    def on_train_batch_end(self, trainer: Any, pl_module: Any, *args: Any, **kwargs: Any) -> None:
        if self.window.ready:
            self._finish(trainer)

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        self._finish(trainer)

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._finish(trainer, exception)

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self._finish(trainer)

    def _finish(self, trainer: Any, exc: BaseException | None = None) -> None:
        if not self.window.measuring:
            return
        report = self.window.end(_log_dir(trainer), exc)
        metrics = metrics_of(report) if report is not None else {}
        if metrics:
            for logger in trainer.loggers:
                logger.log_metrics(metrics, step=trainer.global_step)
                logger.save()
        if report is not None and self.export:
            export(report, logger_sinks(trainer.loggers), step=trainer.global_step)
        if self.stop:
            trainer.should_stop = True


def logger_sinks(loggers: list[Any]) -> list[Sink | str]:
    """A sink for each logger that has a TensorBoard writer, a W&B run or an MLflow run (known by class
    name, subclasses included: the ``lightning`` and ``pytorch_lightning`` packages both have them)."""
    from pitstop.profile.present.mlflow_sink import mlflow_sink
    from pitstop.profile.present.tensorboard import TensorBoardSink
    from pitstop.profile.present.wandb_sink import wandb_sink

    sinks: list[Sink | str] = []
    for logger in loggers:
        names = {c.__name__ for c in type(logger).__mro__}
        if "TensorBoardLogger" in names:
            sinks.append(TensorBoardSink(writer=logger.experiment))
        elif "WandbLogger" in names:
            sinks.append(wandb_sink(run=logger.experiment))
        elif "MLFlowLogger" in names:
            sinks.append(mlflow_sink(client=logger.experiment, run_id=logger.run_id))
    return sinks


def _log_dir(trainer: Any) -> str:
    """``trainer.log_dir`` without its broadcast: only rank 0 gets here, and a collective would hang."""
    if trainer.loggers:
        lg = trainer.loggers[0]
        return getattr(lg, "log_dir", None) or lg.save_dir or trainer.default_root_dir
    return trainer.default_root_dir
