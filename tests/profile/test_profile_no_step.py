"""A script that ends within its warm-up steps is told so (``profile.no_step`` says how many optimizer
steps it saw, all warm-up, and to run longer or lower --warmup), not that it has no optimizer step."""

from __future__ import annotations

from pitstop.profile.analyze.rules import problem_findings


def _warm(i: int) -> dict:
    return {"index": i, "total_s": 0.01, "warmup": True}


def test_a_run_that_ends_in_its_warmup_says_so():
    data = {
        "steps": [_warm(i) for i in range(3)],
        "warmup": 5,
        "status": "completed",
        "step_boundary": "optimizer.step()",
        "totals": {"optimizer_steps": 3, "forwards": 3, "backwards": 3},
    }
    found, bd = problem_findings([], data)
    assert bd is None
    (f,) = [f for f in found if f.id == "profile.no_step"]
    assert f.title == "All 3 optimizer steps were warm-up: none was measured"
    assert "first 5 that --warmup leaves out" in f.evidence and "neither optimizer.step()" not in f.evidence
    assert "--warmup" in f.fix and "longer" in f.fix
    assert f.data["warmup_steps"] == 3


def test_no_step_boundary_at_all_is_still_no_step():
    found, _ = problem_findings([], {"steps": [], "totals": {"forwards": 2}})
    (f,) = [f for f in found if f.id == "profile.no_step"]
    assert "neither optimizer.step() nor enough backward()" in f.evidence
