"""The in-process timers' clock: a stopwatch that leaves paused stretches out (a fake clock, no timing)."""

from __future__ import annotations

import pytest

from pitstop.measure.clock import Stopwatch, time_block


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
