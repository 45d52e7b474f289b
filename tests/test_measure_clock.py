"""The in-process timers' clock: a stopwatch that leaves paused stretches out (a fake clock, no timing)."""

from __future__ import annotations

import pytest

from pitstop.measure.clock import Stopwatch, time_block, time_calls


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_elapsed_counts_from_when_it_was_made():
    clock = FakeClock()
    watch = Stopwatch(clock)
    clock.now += 2.5
    assert watch.elapsed() == pytest.approx(2.5)


def test_a_paused_stretch_is_left_out_even_when_it_raises():
    clock = FakeClock()
    watch = Stopwatch(clock)
    clock.now += 1.0
    with watch.paused():
        clock.now += 4.0
    with pytest.raises(StopIteration), watch.paused():
        clock.now += 3.0
        raise StopIteration
    clock.now += 0.5
    assert watch.paused_s == pytest.approx(7.0)
    assert watch.elapsed() == pytest.approx(1.5)


def test_a_block_is_timed_as_one_after_its_untimed_warm_up_with_a_sync_at_both_ends():
    clock, calls = FakeClock(), []

    def step() -> None:
        calls.append("step")
        clock.now += 0.5

    def sync() -> None:
        calls.append("sync")
        clock.now += 1.0  # queued device work: counted once, in the block

    assert time_block(step, 4, sync, warmup=1, clock=clock) == pytest.approx((4 * 0.5 + 1.0) / 4)
    assert calls == ["step", "sync"] + ["step"] * 4 + ["sync"]


def test_each_call_is_timed_alone_between_syncs_and_between_runs_outside_it():
    clock, calls = FakeClock(), []

    def step() -> None:
        calls.append("step")
        clock.now += 0.5

    def sync() -> None:
        calls.append("sync")
        clock.now += 0.25

    def reading() -> None:
        calls.append("read")
        clock.now += 10.0  # not in any call's time

    assert time_calls(step, 2, sync, between=reading, clock=clock) == pytest.approx([0.75, 0.75])
    assert calls == ["sync", "step", "sync", "read"] * 2


def test_the_series_ends_once_the_budget_is_spent_but_not_before_min_calls():
    clock = FakeClock()

    def step() -> None:
        clock.now += 1.0

    assert len(time_calls(step, 10, budget_s=2.5, min_calls=1, clock=clock)) == 3
    assert len(time_calls(step, 10, budget_s=0.5, min_calls=4, clock=clock)) == 4
    assert len(time_calls(step, 2, budget_s=100.0, clock=clock)) == 2
