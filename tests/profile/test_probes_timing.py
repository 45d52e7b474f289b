"""The probes' timing goes through pitstop.measure: every interleaved probe saving carries its interval.
Structure only (no timing assertions): the fake variants cost whatever the machine gives them."""

from __future__ import annotations

import math

import pytest
import torch

from pitstop.measure import Interval
from pitstop.profile.probe.probes import Timed, run_probes, saving, timed


def test_timed_gives_medians_and_an_interval_for_every_variant_after_the_first():
    calls = {"a": 0, "b": 0}

    def a() -> None:
        calls["a"] += 1

    def b() -> None:
        calls["b"] += 1

    t = timed({"a": a, "b": b}, "cpu", reps=4, budget_s=5.0)
    assert set(t.medians) == {"a", "b"} and all(v > 0 for v in t.medians.values())
    assert set(t.intervals) == {"b"}
    iv = t.intervals["b"]
    # at most 4 rounds; from round 3 a decided interval ends them (the sequential rule's first look)
    assert iv is not None and 3 <= iv.rounds <= 4 and iv.lo <= iv.estimate <= iv.hi
    # one warm-up call each, then 3-4 rounds of up to 3 calls
    assert calls["a"] == calls["b"] and 4 <= calls["a"] <= 13
    assert t.budget_s == 5.0  # quick variants: the budget as given


def test_a_probes_budget_scales_with_slow_variants_up_to_its_cap():
    from pitstop.profile.probe.probes import (
        PROBE_BUDGET_CAP_S,
        PROBE_BUDGET_S,
        PROBE_ROUNDS,
        all_probes_budget,
        probe_budget,
    )

    assert probe_budget(0.1) == PROBE_BUDGET_S
    assert probe_budget(3.0) == pytest.approx(1.25 * PROBE_ROUNDS * 3.0)  # 3 rounds of 3 s fit
    assert probe_budget(100.0) == PROBE_BUDGET_CAP_S
    assert all_probes_budget(None) == all_probes_budget(0.05) == 20.0
    assert 20.0 < all_probes_budget(1.0) <= all_probes_budget(60.0) == 120.0


def test_saving_bounds_follow_the_speedup_interval():
    t = Timed({"x": 0.12, "y": 0.10}, {"y": Interval(1.2, 1.1, 1.3, 5, 15, 15)})
    s = saving(t, "x", "y")
    assert math.isclose(s["saving_s"], 0.02)
    assert math.isclose(s["saving_lo_s"], 0.12 - 0.12 / 1.1) and math.isclose(
        s["saving_hi_s"], 0.12 - 0.12 / 1.3
    )
    assert s["interval"]["rounds"] == 5 and "95% CI 1.10" in s["interval_text"]
    assert "budget_scaled" not in s
    assert saving(Timed({"x": 1.0, "y": 0.5}, {"y": None}, 11.25, True), "x", "y")["budget_scaled"] is True
    # no interval (a single round fitted the budget): the point estimate only
    assert "saving_lo_s" not in saving(Timed({"x": 0.1, "y": 0.1}, {"y": None}), "x", "y")


def test_run_probes_attaches_intervals_to_the_optimizer_probe():
    model = torch.nn.Linear(8, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, foreach=False)
    facts = {"type": "SGD", "impl": "for-loop", "supports_foreach": True}
    out = run_probes(None, None, {}, [(opt, facts)])
    (probe,) = out["optimizer"]
    assert {"base_s", "new_s", "saving_s", "saving_lo_s", "saving_hi_s", "interval"} <= set(probe)
    assert probe["interval"]["rounds"] >= 2
