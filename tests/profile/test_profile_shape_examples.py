"""The loop-shape examples, profiled as a user would: two optimizers a step (GAN), a closure optimizer
(LBFGS), direct ``model.forward(x)`` calls, a float64 model."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import pytest

from pitstop.profile.runs.runner import RunSpec, run

pytestmark = pytest.mark.slow
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
STEPS, WARMUP = 6, 2


def profile_example(name: str, *args: str, probes: bool = True):
    spec = RunSpec(
        command=[sys.executable, str(EXAMPLES / name), *args],
        steps=STEPS,
        warmup=WARMUP,
        quiet=True,
        probes=probes,
        env={"OMP_NUM_THREADS": "1"},
    )
    result = run(spec)
    assert result.ok, result.error
    assert len(result.steps) == STEPS
    report = result.report()
    sites = Counter((f.id, f.location) for f in report.findings if f.location)
    assert all(n == 1 for n in sites.values()), sites  # one finding per site
    return result, report


def test_a_gan_is_one_step_per_iteration():
    result, report = profile_example("gan_two_optimizers.py", probes=False)
    totals = result.data["totals"]
    # two optimizer steps per batch, and a step per batch: the measured steps hold one batch each
    assert totals["optimizer_steps"] == 2 * totals["batches"]
    assert WARMUP + STEPS <= totals["batches"] <= WARMUP + STEPS + 2 + 1  # (+ the first ones cut anew)
    assert all(s.forward_s > 0 and s.backward_s > 0 and s.optimizer_s > 0 for s in result.steps)
    assert all(s.data_wait_s > 0 for s in result.steps)
    assert len(result.losses) == STEPS
    assert report.meta["step_boundary"] == "optimizer.step()"


def test_an_lbfgs_loop_is_probed_without_error():
    result, report = profile_example("lbfgs_closure.py", "--samples", "512")
    probes = report.sections["probes"]
    assert "error" not in probes, probes["error"]
    assert "error" not in (probes.get("host_memory") or {}), probes["host_memory"]
    assert not [f for f in report.findings if f.id == "profile.probe_failed"]
    assert all(s.forward_s > 0 and s.backward_s > 0 for s in result.steps)
    assert result.data["totals"]["forwards"] > result.data["totals"]["optimizer_steps"]  # line search


def test_direct_forward_calls_are_timed_and_the_model_probed():
    result, report = profile_example("direct_forward.py", "--batch-size", "32", "--features", "64")
    assert result.config["models"][0]["type"] == "Net"
    assert all(s.forward_s > 0 for s in result.steps)
    assert report.sections.get("mfu"), report.sections.keys()  # the model and its inputs were captured
    assert "pass_s" in report.sections["probes"]


def test_a_float64_model_is_a_precision_finding_with_its_float32_gain_measured():
    _, report = profile_example("float64_model.py", "--batch-size", "64", "--features", "64")
    f = report.by_id("precision.float64")
    assert f is not None and f.location.endswith(
        "float64_model.py:" + str(_line("float64_model.py", "loss_fn(model("))
    )
    assert f.data["base_s"] > 0 and f.data["new_s"] > 0 and "interval" in f.data
    # measured, so never the untimed info; warning or pass follows its interval on this machine
    assert "not measured in this run" not in f.evidence


def _line(name: str, needle: str) -> int:
    lines = (EXAMPLES / name).read_text().splitlines()
    return next(i for i, text in enumerate(lines, 1) if needle in text)
