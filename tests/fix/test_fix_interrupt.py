"""Ctrl-C or SIGTERM during `pitstop fix`'s candidate runs: the run in progress is stopped by the runner
(status "interrupted"), no further run starts, the report keeps what was measured and says it was
interrupted (exit 130), and a candidate that never ran is not called failed."""

from __future__ import annotations

import pytest

from pitstop.fix import FixConfig, fix_report, run_fix
from pitstop.profile.record.timeline import StepRecord
from pitstop.profile.runs.runner import RunResult, RunSpec


@pytest.fixture(autouse=True)
def _bf16_not_slower(monkeypatch):
    monkeypatch.setattr("pitstop.recipes.autocast.slower_reason", lambda dtype, dev: None)


class StoppedAt:
    """Runs of 6 steps (autocast faster); the ``at``-th run is the one Ctrl-C stopped."""

    def __init__(self, at: int, script) -> None:
        self.at, self.specs = at, []
        script.write_text("import torch\n")
        self.config = {"models": [{"first_location": f"{script}:1"}], "optimizers": [], "loaders": []}

    def __call__(self, spec: RunSpec) -> RunResult:
        self.specs.append(spec)
        step = 0.07 if spec.overrides.autocast else 0.1
        status = "interrupted" if len(self.specs) == self.at else "stopped"
        steps = [StepRecord(index=i, start_s=i * step, total_s=step) for i in range(6)]
        return RunResult(0, None, steps, [1.0] * 6, dict(self.config), None, 1.0, status=status)


def test_a_run_the_user_stopped_ends_fix_with_what_was_measured(tmp_path):
    runner = StoppedAt(4, tmp_path / "train.py")
    cfg = FixConfig(candidates=("amp", "foreach"), budget=600)
    r = run_fix(["python", "train.py"], cfg, runner=runner)
    assert r.interrupted and len(runner.specs) == 4  # nothing started after the stopped run
    assert r.baseline.steps_per_s  # the baseline's runs before the stop are kept
    verdicts = {m.kind: m.verdict for m in r.candidates}
    assert "failed" not in verdicts.values(), verdicts
    report, _ = fix_report(r, {"command": "python train.py"})
    assert report.meta["interrupted"] and report.error.startswith("interrupted")
