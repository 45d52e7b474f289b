"""The probes' timing goes through pitstop.measure: every interleaved probe saving carries its interval.
Structure only (no timing assertions): the fake variants cost whatever the machine gives them."""

from __future__ import annotations

import math

import torch

from pitstop.measure import Interval
from pitstop.profile.probes import Timed, run_probes, saving, timed


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
    assert iv is not None and iv.rounds == 4 and iv.lo <= iv.estimate <= iv.hi
    # one warm-up call each, then 4 rounds of up to 3 calls
    assert calls["a"] == calls["b"] and 5 <= calls["a"] <= 13


def test_saving_bounds_follow_the_speedup_interval():
    t = Timed({"x": 0.12, "y": 0.10}, {"y": Interval(1.2, 1.1, 1.3, 5, 15, 15)})
    s = saving(t, "x", "y")
    assert math.isclose(s["saving_s"], 0.02)
    assert math.isclose(s["saving_lo_s"], 0.12 - 0.12 / 1.1) and math.isclose(
        s["saving_hi_s"], 0.12 - 0.12 / 1.3
    )
    assert s["interval"]["rounds"] == 5 and "95% CI 1.10" in s["interval_text"]
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
