"""What the Lightning and HF Trainer callbacks share: profile optimizer steps N..M of a fit, write the
report next to the trainer's logs, turn it into scalar metrics for the trainer's logger, and the options
both take (``WindowCallback``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from pitstop.findings import Report
from pitstop.integrations.profiler import Profiler
from pitstop.profile.record.timeline import PARTS

PREFIX = "pitstop/"


def metrics_of(report: Report) -> dict[str, float]:
    """The step breakdown (median step, each part's mean, in ms), steps/s, and MFU when the report has it."""
    out: dict[str, float] = {}
    bd = report.sections.get("breakdown") or {}
    if bd:
        out[f"{PREFIX}step_ms"] = 1000.0 * float(bd["median_step_s"])
        for part in PARTS:
            out[f"{PREFIX}{part.removesuffix('_s')}_ms"] = 1000.0 * float(bd.get(part, 0.0))
    sps = report.meta.get("steps_per_s")
    if sps:
        out[f"{PREFIX}steps_per_s"] = float(sps)
    mfu = mfu_of(report)
    if mfu is not None:
        out[f"{PREFIX}mfu"] = mfu
    return out


def mfu_of(report: Report) -> float | None:
    """Model FLOPs utilisation, if the report carries one (``sections.mfu`` as a number or a dict with
    ``mfu``, or ``meta.mfu``)."""
    for v in (report.sections.get("mfu"), report.meta.get("mfu")):
        if isinstance(v, dict):
            v = v.get("mfu")
        if isinstance(v, int | float) and not isinstance(v, bool):
            return float(v)
    return None


@dataclass
class FitWindow:
    """Steps ``start_step`` .. ``stop_step`` (optimizer steps from the start of the fit, end exclusive).

    The instrumentation goes in when the fit starts, so the loaders and optimizers the trainer builds are
    seen as the CLI sees them (loaders built earlier, e.g. passed to fit or wrapped by accelerate, are
    measured from the first iterator made after); the steps before ``start_step`` count as warm-up.
    """

    start_step: int = 5
    stop_step: int = 35
    probes: bool = True
    filename: str = "pitstop-profile"
    profiler: Profiler | None = None
    report: Report | None = None
    written: list[Path] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.start_step < 0 or self.stop_step <= self.start_step:
            raise ValueError("need 0 <= start_step < stop_step")

    def begin(self, label: str) -> None:
        self.profiler = Profiler(
            steps=self.stop_step - self.start_step, warmup=self.start_step, probes=self.probes, label=label
        )
        self.report = None
        self.profiler.start()

    @property
    def measuring(self) -> bool:
        return self.profiler is not None and self.profiler.active

    @property
    def ready(self) -> bool:
        """The measured steps are done and the report is not made yet."""
        return self.measuring and self.profiler is not None and self.profiler.done

    def end(self, log_dir: str | Path | None, exc: BaseException | None = None) -> Report | None:
        """Finish (probes run here), write JSON and HTML into ``log_dir``; None when not measuring."""
        from pitstop.profile.present.render import html_blocks
        from pitstop.report.html import write_html
        from pitstop.report.jsonfmt import write_json

        if not self.measuring or self.profiler is None:
            return None
        self.report = self.profiler.finish(exc)
        if log_dir is not None:
            base = Path(log_dir) / self.filename
            self.written = [
                write_json(self.report, base.with_suffix(".json")),
                write_html(self.report, base.with_suffix(".html"), html_blocks(self.report)),
            ]
        return self.report


class WindowCallback:
    """The options of both callbacks: profile optimizer steps ``start_step`` .. ``stop_step`` (end
    exclusive) of the fit.

    probes: run the measured what-ifs when the window ends (seconds, bounded).
    stop:   end the fit once the report is made.
    export: write the step breakdown and findings to the trainer's TensorBoard, W&B and MLflow loggers.
    """

    def __init__(
        self,
        start_step: int = 5,
        stop_step: int = 35,
        *,
        probes: bool = True,
        stop: bool = False,
        export: bool = True,
    ) -> None:
        self.window = FitWindow(start_step, stop_step, probes=probes)
        self.stop, self.export = stop, export

    @property
    def report(self) -> Report | None:
        return self.window.report
