"""`pitstop fix` says in its first lines how long it will take and why (``pitstop.fix.estimate``),
from the first run of the script (fake runner: no child process)."""

from __future__ import annotations

import io

import pytest

from pitstop.fix import FixConfig, run_fix
from pitstop.fix.estimate import FixEstimate, estimate
from pitstop.profile.record.timeline import StepRecord
from pitstop.profile.runs.runner import RunResult, RunSpec


def result(step_s: float = 0.1, launch_s: float = 2.0, first_s: float = 1.0) -> RunResult:
    steps = [StepRecord(index=i, start_s=first_s + i * step_s, total_s=step_s) for i in range(8)]
    return RunResult(0, None, steps, [1.0] * 8, {}, None, 5.0, status="stopped", data={"launch_s": launch_s})


def test_a_run_is_its_start_up_and_steps_and_the_least_is_the_first_verdicts_rounds():
    est = estimate(result(), candidates=2, warmup=5, steps=20, min_rounds=3, budget_s=300.0, elapsed_s=6.0)
    assert est is not None
    assert est.startup_s == pytest.approx(3.0) and est.run_s == pytest.approx(3.0 + 25 * 0.1)
    assert est.least_s == pytest.approx(6.0 + 3 * 3 * 5.5)
    text = est.text()
    assert text.startswith("pitstop fix: 56 s at least, 300 s at most: 2 candidate(s)")
    assert "at least 3 rounds" in text and "start-up 3 s + 5+20 steps of 100 ms" in text
    assert text.endswith("(--budget S to change)")
    # the budget caps the least: rounds that cannot fit are not run
    capped = FixEstimate(9, 30.0, 1.0, 5, 20, 3, 120.0, 10.0)
    assert capped.least_s == 120.0
    assert capped.text().startswith("pitstop fix: about 120 s (its --budget; 1660 s for the rounds")
    assert estimate(RunResult(0, None, [], [], {}, None, 1.0), 1, 5, 20, 3, 300.0, 0.0) is None


def test_fix_says_how_long_before_its_first_candidate_run():
    said: list[str] = []

    def runner(spec: RunSpec) -> RunResult:
        return result(0.05 if spec.overrides.channels_last else 0.1)

    run_fix(
        ["python", "train.py"], FixConfig(candidates=("channels_last",)), runner=runner, progress=said.append
    )
    first = next(i for i, m in enumerate(said) if m.startswith("pitstop fix: ") and "at least" in m)
    assert "1 candidate(s)" in said[first]
    assert not any(m.startswith("candidates: run") for m in said[:first])


def test_the_estimate_is_printed_as_a_line_of_its_own(monkeypatch):
    from rich.console import Console
    from rich.progress import Progress as Bar

    import pitstop.fix.progress as fp

    out = io.StringIO()
    monkeypatch.setattr(
        fp,
        "progress_bar",
        lambda label, show, **kw: Bar(console=Console(file=out, width=200), auto_refresh=False),
    )
    with fp.fix_progress(300.0, True) as update:
        update("pitstop fix: 56 s at least, 300 s at most")
        update("candidates: run 1, amp (299 s of budget left)")
    assert "pitstop fix: 56 s at least, 300 s at most" in out.getvalue()
