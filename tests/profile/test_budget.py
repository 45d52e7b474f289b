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


def test_shares_buy_each_in_turn_the_rounds_its_verdict_needs_then_top_up_in_the_same_order():
    need = budget.Need  # own budget, a round's seconds, the rounds a verdict needs
    # two rounds with a quarter spare each in turn (25 s), then what is left to the first, to its own budget
    assert budget.shares(60.0, [need(90.0, 10.0), need(90.0, 10.0)]) == pytest.approx([35.0, 25.0])
    assert budget.shares(60.0, [need(30.0, 10.0), need(90.0, 10.0)]) == pytest.approx([30.0, 30.0])
    # the first gets its interval before the second gets anything: the second's one round decides
    # (min_rounds 1: the blocks within it, with the in-process interval), so it gets one with spare
    assert budget.shares(40.0, [need(90.0, 10.0), need(90.0, 10.0, 1)]) == pytest.approx([27.5, 12.5])
    # one round would not decide (min_rounds 2): not run, and what was left goes to the first
    assert budget.shares(40.0, [need(90.0, 10.0), need(90.0, 10.0)]) == pytest.approx([40.0, None])
    # a small one that fits after a big one that does not: the big one is skipped, not the order
    assert budget.shares(30.0, [need(90.0, 20.0), need(90.0, 5.0)]) == pytest.approx([None, 30.0])
    # its own budget does not hold two rounds: one round only where that decides
    assert budget.shares(100.0, [need(15.0, 10.0)]) == [None]
    assert budget.shares(100.0, [need(15.0, 10.0, 1)]) == pytest.approx([15.0])
    assert budget.shares(7.0, [need(90.0, 10.0, 1)]) == [None]  # not one round
    assert budget.shares(0.0, []) == []


def test_a_confirmation_runs_within_its_share_plus_what_the_ones_before_left_never_into_later_ones():
    # planned 20 s, 30 s planned for the later ones; the earlier ones left 5 s unspent: 25 s
    assert budget.runtime_share(90.0, left_now_s=55.0, later_planned_s=30.0) == pytest.approx(25.0)
    assert budget.runtime_share(22.0, 55.0, 30.0) == pytest.approx(22.0)  # at most its own budget
    # the earlier ones overran by 5 s: its share shrinks, the later ones' stays whole
    assert budget.runtime_share(90.0, 45.0, 30.0) == pytest.approx(15.0)
    assert budget.runtime_share(90.0, 20.0, 30.0) == 0.0


def test_a_skipped_confirmation_says_whether_one_round_did_not_fit_or_would_not_decide():
    (one,) = budget.skip_record(10.6, 7.0, 12.0)["errors"]
    assert one.startswith("not run: one round of fresh runs") and "more than the 7 s left of the 12 s" in one
    (undecided,) = budget.skip_record(9.0, 12.0, 60.0, rounds=2, after_bigger=True)["errors"]
    assert (
        "hold one round of fresh runs (about 9 s" in undecided and "not the 2 an interval needs" in undecided
    )
    assert "bigger predicted savings" in undecided and undecided.endswith("--budget S allows more")
    # the first in run order: nothing with a bigger predicted saving ran before it, its share is too short
    (first,) = budget.skip_record(9.0, 12.0, 60.0, rounds=2)["errors"]
    assert first.startswith("not run: the 12 s left of the 60 s budget hold one round of fresh runs")
    assert "not the 2 an interval needs" in first and "bigger" not in first
    assert budget.skip_record(9.0, 5.0, 60.0, rounds=2)["errors"][0].startswith("not run: one round")


def test_the_plan_line_gives_each_stage_and_how_to_change_the_budget():
    plan = budget.Plan(
        60.0, budget.stages(run_with(launch_s=1.5)), [("workers", 25.0), ("amp", 15.0), ("host_memory", 0.0)]
    )
    assert plan.left_s == pytest.approx(60.0 - 7.0 - budget.RESERVE_S) and plan.confirm_s == pytest.approx(
        40.0
    )
    text = plan.text()
    assert text.startswith("answer in about 60 s: start-up 4 s, measured window 2 s, probes 7 s")
    # in the order they run, each with its seconds
    assert "confirmations at most 40 s (workers 25 s, amp 15 s, host_memory only on time left over)" in text
    assert text.endswith("--budget S to change (now 60 s)")
    alone = budget.Plan(60.0, budget.stages(run_with()), [])
    assert "no confirmations" in alone.text()


def test_the_budget_option_needs_seconds_above_zero(tmp_path, capsys):
    from pitstop.cli import main

    script = tmp_path / "train.py"
    script.write_text("")
    assert main(["profile", "--budget", "0", "--", "python", str(script)]) == 2
    assert "--budget needs seconds > 0" in capsys.readouterr().err
