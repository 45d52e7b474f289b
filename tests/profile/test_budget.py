"""The time budget the fresh confirmation runs share (``pitstop.profile.confirm.budget``): the profiled run's
stages, one round's estimate from its start-up, the shares and the line printed before the runs
(``test_fresh_confirm``: the runs within it)."""

from __future__ import annotations

import pytest

from pitstop.profile.confirm import budget
from pitstop.profile.record.timeline import StepRecord
from pitstop.profile.runs.runner import RunResult


def run_with(launch_s=None, first_s=2.0, step=0.5, n=4, probes_s=7.0, warmup=1):
    records = [
        StepRecord(index=i, start_s=first_s + i * step, total_s=step, warmup=i < warmup) for i in range(n)
    ]
    data = {"probes_s": probes_s} if launch_s is None else {"probes_s": probes_s, "launch_s": launch_s}
    return RunResult(0, None, records[warmup:], [], {}, None, 20.0, warmup_steps=records[:warmup], data=data)


def test_stages_are_read_off_the_run_start_up_from_launch_to_the_first_step():
    st = budget.stages(run_with(launch_s=1.5))
    assert st == budget.Stages(startup_s=3.5, window_s=2.0, probes_s=7.0, run_s=20.0)
    # no launch recorded: the import is taken as IMPORT_S
    assert budget.stages(run_with()).startup_s == pytest.approx(budget.IMPORT_S + 2.0)


def test_a_round_is_two_fresh_runs_each_paying_the_measured_start_up_again():
    r = run_with(launch_s=1.0)
    assert budget.round_s(r, steps=10, warmup=3) == pytest.approx(2 * (3.0 + 13 * 0.5))
    assert budget.round_s(RunResult(0, None, [], [], {}, None, 1.0), 10, 3) == 0.0


def test_shares_split_what_is_left_and_never_start_a_round_that_does_not_fit():
    assert budget.share(60.0, 90.0, 10.0, waiting=3) == pytest.approx(20.0)  # an even share
    assert budget.share(60.0, 15.0, 10.0, waiting=1) == pytest.approx(15.0)  # at most its own budget
    assert budget.share(30.0, 90.0, 20.0, waiting=3) == pytest.approx(25.0)  # raised to a round, spare
    assert budget.share(22.0, 90.0, 20.0, waiting=3) == pytest.approx(22.0)  # raised, within what is left
    assert budget.share(15.0, 90.0, 20.0, waiting=1) is None  # not one round


def test_the_plan_line_gives_each_stage_and_how_to_change_the_budget():
    plan = budget.Plan(60.0, budget.stages(run_with(launch_s=1.5)), [("amp", 20.0), ("channels_last", 20.0)])
    assert plan.left_s == pytest.approx(60.0 - 7.0 - budget.RESERVE_S) and plan.confirm_s == pytest.approx(
        40.0
    )
    text = plan.text()
    assert text.startswith("answer in about 60 s: start-up 4 s, measured window 2 s, probes 7 s")
    assert "confirmations at most 40 s (amp, channels_last)" in text
    assert text.endswith("--budget S to change (now 60 s)")
    alone = budget.Plan(60.0, budget.stages(run_with()), [])
    assert "no confirmations" in alone.text()


def test_the_budget_option_needs_seconds_above_zero(tmp_path, capsys):
    from pitstop.cli import main

    script = tmp_path / "train.py"
    script.write_text("")
    assert main(["profile", "--budget", "0", "--", "python", str(script)]) == 2
    assert "--budget needs seconds > 0" in capsys.readouterr().err
