"""pitstop fix on the MNIST-style example (real child runs): every candidate gets a verdict and an
interval. Structure only: which verdict depends on the machine and how busy it is."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from pitstop.fix import FixConfig, fix_report, run_fix
from pitstop.measure import HELPED, HURT, NO_CHANGE, UNDECIDED

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "mnist_style.py"


@pytest.mark.slow
def test_fix_on_the_mnist_style_example_gives_every_candidate_a_verdict_and_an_interval(tmp_path):
    # 8 steps an epoch, so every run crosses epoch boundaries and their test passes (eval outliers)
    cmd = [sys.executable, str(EXAMPLE), "--epochs", "1000", "--samples", "256", "--batch-size", "32"]
    cfg = FixConfig(
        steps=10, warmup=2, budget=240.0, max_rounds=4, candidates=("host_memory", "foreach"), timeout=300
    )
    r = run_fix(cmd, cfg)
    assert r.baseline.steps_per_s, r.baseline.errors
    assert {c.kind for c in r.candidates if not c.on_top_of} == {"host_memory", "foreach"}
    for c in r.candidates:
        assert c.verdict in (HELPED, HURT, NO_CHANGE, UNDECIDED), (c.name, c.verdict, c.reason)
        assert c.interval is not None and c.interval.rounds >= 1, c.name
        assert c.interval.lo <= c.interval.estimate <= c.interval.hi
    assert any(o.why == "eval" for m in [r.baseline, *r.candidates] for o in m.arm.outliers)
    report, blocks = fix_report(r)
    for c in r.candidates:
        f = next(f for f in report.findings if f.id == f"fix.{c.kind}" and f.title.startswith(c.name))
        assert "CI" in f.evidence or "no interval" in f.evidence
        assert report.sections["fix"]["candidates"][r.candidates.index(c)]["interval"] is not None
    assert any("<circle" in b.html for b in blocks)  # the interval plot
