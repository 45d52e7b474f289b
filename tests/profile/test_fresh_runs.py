"""Predictions timed in fresh runs of the script, as it is vs with the fix (fake runner: no child process):
the page faults (plain vs glibc's env) and the DataLoader workers (as it is vs the workers injected)."""

from __future__ import annotations

import pytest

from pitstop.findings import Severity
from pitstop.profile.analyze.rules import findings_for
from pitstop.profile.confirm import fresh_runs
from pitstop.profile.confirm import malloc_confirm as mc
from pitstop.profile.confirm import workers_confirm as wk
from pitstop.profile.record.overrides import Overrides
from pitstop.profile.record.timeline import StepRecord
from pitstop.profile.runs.runner import RunResult, RunSpec
from pitstop.recipes.host_memory import GLIBC_ENV

JITTER = [1.0, 1.02, 0.98, 1.01, 0.99, 1.03, 0.97, 1.0, 1.01, 0.99]


def steps(total, n=10, faults=4000, jitter=None, wait=0.0):
    j = jitter or [1.0] * n
    return [
        StepRecord(
            index=i,
            start_s=i * total,
            total_s=total * j[i % len(j)],
            forward_s=total / 2 - wait,
            data_wait_s=wait,
            minor_faults=faults,
        )
        for i in range(n)
    ]


def glibc(spec: RunSpec) -> bool:
    return bool(spec.env.get("MALLOC_MMAP_THRESHOLD_"))


def workers_on(spec: RunSpec) -> bool:
    return bool(spec.overrides.dataloader.get("num_workers"))


class FakeRunner:
    """Step times by configuration: ``kept`` where ``fixed(spec)`` (default: under glibc's env), ``plain``
    otherwise; every run its own speed factor."""

    def __init__(self, plain, kept, run_factor=(1.0, 1.04, 0.97, 1.02), fixed=glibc, faults=4000):
        self.plain, self.kept, self.run_factor, self.specs = plain, kept, run_factor, []
        self.fixed, self.faults = fixed, faults

    def __call__(self, spec: RunSpec) -> RunResult:
        self.specs.append(spec)
        f = self.run_factor[len(self.specs) % len(self.run_factor)]  # every run its own speed
        t = (self.kept if self.fixed(spec) else self.plain) * f
        return RunResult(0, None, steps(t, faults=self.faults, jitter=JITTER), [], {}, None, 1.0)


PREDICTS_WARN = {
    "base_s": 0.05,
    "new_s": 0.04,
    "saving_s": 0.01,
    "base_faults": 3000,
    "new_faults": 0,
    "confirmed": False,
}


def profiled(hm=PREDICTS_WARN):
    return RunResult(0, None, steps(0.1), [], {}, None, 5.0, data={"probes": {"host_memory": dict(hm)}})


def host_finding(result):
    found, _ = findings_for(result.steps, result.data, cores=2)
    return next(f for f in found if f.id == "host.page_faults")


def test_only_a_prediction_that_would_warn_is_timed_again():
    assert mc.worth_confirming(profiled())
    assert not mc.worth_confirming(profiled({**PREDICTS_WARN, "saving_s": 0.0001, "new_s": 0.0499}))
    assert not mc.worth_confirming(profiled({"skipped": "jemalloc", "kept": True}))
    runner = FakeRunner(0.1, 0.1)
    result = profiled({**PREDICTS_WARN, "saving_s": 0.0001, "new_s": 0.0499})
    assert not mc.maybe_confirm(RunSpec(["python", "t.py"]), result, runner) and runner.specs == []


def test_a_real_gain_in_fresh_runs_confirms_the_warning():
    runner = FakeRunner(plain=0.1, kept=0.08)
    result = profiled()
    assert mc.maybe_confirm(RunSpec(["python", "t.py"], env={"A": "1"}), result, runner)
    # alternating plain and glibc's env, each run a few steps without probes
    envs = [bool(s.env.get("MALLOC_TRIM_THRESHOLD_")) for s in runner.specs]
    assert envs[:4] == [False, True, True, False] and len(envs) == 2 * mc.MIN_ROUNDS  # decided: stops
    assert all(s.env["A"] == "1" and not s.probes and s.steps == mc.STEPS for s in runner.specs)
    assert all(
        s.env["MALLOC_MMAP_THRESHOLD_"] == GLIBC_ENV["MALLOC_MMAP_THRESHOLD_"] for s in runner.specs[1:3]
    )
    two = result.data["probes"]["host_memory"]["two_process"]
    assert two["rounds"] == mc.MIN_ROUNDS and two["saving_s"] == pytest.approx(0.02, rel=0.25)
    f = host_finding(result)
    assert f.severity is Severity.WARN and f.data["confirmed"] is True
    lo, hi = f.data["saving_ci_s"]
    assert 0.005 <= lo < hi  # >= 5% of the 100 ms step even at the lower bound
    assert (
        f.est_saving_s == pytest.approx(two["saving_s"])
        and "fresh runs of the script, as it is vs glibc's env" in f.evidence
    )


def test_no_gain_in_fresh_runs_leaves_the_finding_info_not_confirmed():
    runner = FakeRunner(plain=0.1, kept=0.1)
    result = profiled()
    mc.maybe_confirm(RunSpec(["python", "t.py"]), result, runner)
    f = host_finding(result)
    assert f.severity is Severity.INFO and "not confirmed" in f.evidence
    assert f.est_saving_s == pytest.approx(0.0, abs=0.003)


def test_runs_that_fail_leave_the_in_process_probe_unconfirmed():
    def failing(spec):
        return RunResult(1, "boom", [], [], {}, None, 1.0, status="failed")

    result = profiled()
    mc.maybe_confirm(RunSpec(["python", "t.py"]), result, failing)
    two = result.data["probes"]["host_memory"]["two_process"]
    assert "saving_s" not in two and "boom" in two["errors"]
    f = host_finding(result)
    assert f.severity is Severity.INFO and "cannot be interleaved" in f.evidence
    assert "the fresh runs with the fix measured nothing (boom" in f.evidence


# The nanoGPT-style CPU run of the issue: a 55 ms step, 854 faults a step, 5.24 us a fault in the
# in-process probe -> 4.5 ms predicted (8% of the step): a warning on the point estimate alone.
NANOGPT_PROBE = {
    "base_s": 0.055,
    "new_s": 0.055 - 0.00524,
    "saving_s": 0.00524,
    "base_faults": 1000,
    "new_faults": 0,
    "confirmed": False,
}


def nanogpt_profiled():
    return RunResult(
        0,
        None,
        steps(0.055, faults=854),
        [],
        {},
        None,
        5.0,
        data={"probes": {"host_memory": dict(NANOGPT_PROBE)}},
    )


def NanoGptRunner(plain, kept):
    return FakeRunner(plain, kept, faults=854)


def test_nanogpt_shape_page_faults_predicted_in_process_only_are_info():
    result = nanogpt_profiled()
    assert mc.worth_confirming(result)  # the point estimate would warn
    f = host_finding(result)
    assert f.est_saving_s == pytest.approx(0.00524 / 1000 * 854)
    assert f.severity is Severity.INFO and f.data["confirmed"] is False and f.data["saving_ci_s"] is None


def test_nanogpt_shape_page_faults_that_fresh_runs_measure_as_noise_are_info():
    # the measurement: 54.96 ms plain vs 53.28 ms with glibc's env, runs 4% apart
    result = nanogpt_profiled()
    mc.maybe_confirm(RunSpec(["python", "train.py"]), result, NanoGptRunner(plain=0.05496, kept=0.05328))
    f = host_finding(result)
    assert f.severity is Severity.INFO and f.data["confirmed"] is False
    assert f.data["saving_ci_s"][0] < 0.05 * 0.055
    assert "fresh runs of the script, as it is vs glibc's env" in f.evidence and "not confirmed" in f.evidence


def test_nanogpt_shape_page_faults_confirmed_by_fresh_runs_warn_with_the_interval():
    result = nanogpt_profiled()
    mc.maybe_confirm(RunSpec(["python", "train.py"]), result, NanoGptRunner(plain=0.055, kept=0.044))
    f = host_finding(result)
    assert f.severity is Severity.WARN and f.data["confirmed"] is True
    lo, hi = f.data["saving_ci_s"]
    assert 0.05 * 0.055 <= lo <= f.est_saving_s <= hi
    assert "confirmed: saving" in f.evidence and "95% CI" in f.evidence


# ------------------------------------------------------------------------------------ DataLoader workers

LOADER = {
    "location": "train.py:12",
    "num_workers": 0,
    "batches_seen": 24,
    "batches_per_epoch": 6,
    "wait_s": 1.8,
    "first_batch_s": [0.075],
    "iterators": 4,
}


# the slow_loader shape of the issue: 75% of a 100 ms step waiting for data, 2 usable cores
def loader_profiled():
    return RunResult(
        0, None, steps(0.1, n=12, wait=0.075), [], {}, None, 5.0, data={"loaders": [dict(LOADER)]}
    )


def workers_finding(result):
    found, _ = findings_for(result.steps, result.data, cores=2)
    return next(f for f in found if f.id == "dataloader.workers")


def test_only_a_data_wait_that_would_warn_is_timed_again():
    assert wk.worth_confirming(loader_profiled(), cores=2)
    small = RunResult(
        0, None, steps(0.1, n=12, wait=0.001), [], {}, None, 5.0, data={"loaders": [dict(LOADER)]}
    )
    runner = FakeRunner(0.1, 0.1, fixed=workers_on)
    assert not wk.worth_confirming(small, cores=2)
    assert not wk.maybe_confirm(RunSpec(["python", "t.py"]), small, runner, cores=2) and runner.specs == []
    done = loader_profiled()
    done.data[wk.KEY] = {}
    assert not wk.worth_confirming(done, cores=2)  # measured once already


def test_the_fix_runs_inject_the_suggested_workers_alternating_with_the_script_as_it_is():
    runner = FakeRunner(plain=0.1, kept=0.07, fixed=workers_on)
    result = loader_profiled()
    spec = RunSpec(["python", "t.py"], overrides=Overrides(dataloader={"pin_memory": True}))
    assert wk.maybe_confirm(spec, result, runner, cores=2)
    injected = [bool(s.overrides.dataloader.get("num_workers")) for s in runner.specs]
    assert injected[:4] == [False, True, True, False] and len(injected) == 2 * fresh_runs.MIN_ROUNDS
    fixed = runner.specs[1].overrides.dataloader
    # recipes.workers on 2 cores: one worker, one core left to training
    assert fixed == {"pin_memory": True, **Overrides.workers(1).dataloader}  # the script's own kept
    assert all(not s.probes and s.steps == wk.STEPS for s in runner.specs)
    assert result.data[wk.KEY]["num_workers"] == 1 and result.data[wk.KEY]["rounds"] == fresh_runs.MIN_ROUNDS


def test_a_measured_gain_smaller_than_the_wait_is_the_prediction():
    # the slow_loader: 75% of the step waits (a 4x model), the fix measured about 1.4x
    runner = FakeRunner(plain=0.1, kept=0.07, fixed=workers_on)
    result = loader_profiled()
    wk.maybe_confirm(RunSpec(["python", "t.py"]), result, runner, cores=2)
    f = workers_finding(result)
    assert f.severity is Severity.WARN and f.data["confirmed"] is True
    speedup = 0.1 / (0.1 - f.est_saving_s)
    assert speedup == pytest.approx(1 / 0.7, rel=0.05)  # the measured speed-up, not the 4x of the wait
    lo, hi = f.data["saving_ci_s"]
    assert 0.005 <= lo <= f.est_saving_s <= hi < 0.075
    assert "timed in fresh runs of the script, as it is vs num_workers=1 (persistent), 3 rounds" in f.evidence
    assert f.data["two_process"]["interval"]["rounds"] == fresh_runs.MIN_ROUNDS == 3


def test_no_gain_of_the_workers_in_fresh_runs_leaves_the_finding_info():
    result = loader_profiled()
    wk.maybe_confirm(
        RunSpec(["python", "t.py"]), result, FakeRunner(plain=0.1, kept=0.1, fixed=workers_on), cores=2
    )
    f = workers_finding(result)
    assert f.severity is Severity.INFO and f.data["confirmed"] is False
    assert f.est_saving_s == pytest.approx(0.0, abs=0.004) and "not confirmed" in f.evidence


def test_fix_runs_that_fail_say_so_and_leave_the_finding_info():
    def failing(spec):
        if spec.overrides.dataloader.get("num_workers"):
            return RunResult(1, "worker crashed", [], [], {}, None, 1.0, status="failed")
        return RunResult(0, None, steps(0.1), [], {}, None, 1.0)

    result = loader_profiled()
    wk.maybe_confirm(RunSpec(["python", "t.py"]), result, failing, cores=2)
    f = workers_finding(result)
    assert f.severity is Severity.INFO and f.data["saving_ci_s"] is None
    assert "the fresh runs measured nothing (worker crashed" in f.evidence


def test_without_fresh_runs_the_model_of_the_wait_judges_it():
    f = workers_finding(loader_profiled())
    assert "two_process" not in f.data and "blocks of the run's steps" in f.evidence


def test_min_rounds_lets_a_verdict_stop_the_runs_before_the_last_round():
    """By default a clear gain is decided at round ``MIN_ROUNDS`` (3) of 40, as the calibration asks;
    ``min_rounds`` at the cap runs every round first, and one above the cap is the cap."""
    run = FakeRunner(0.05, 0.025)
    out = fresh_runs.timed(RunSpec(["python", "t.py"]), glibc_variant, run, budget_s=1e9, rounds=40)
    assert out["verdict"] == "helped" and out["rounds"] == fresh_runs.MIN_ROUNDS == 3
    for min_rounds in (6, 7):
        run = FakeRunner(0.05, 0.025)
        out = fresh_runs.timed(
            RunSpec(["python", "t.py"]), glibc_variant, run, budget_s=1e9, rounds=6, min_rounds=min_rounds
        )
        assert out["verdict"] == "helped" and out["rounds"] == 6


def glibc_variant(spec: RunSpec) -> RunSpec:
    from dataclasses import replace

    return replace(spec, env={**(spec.env or {}), **GLIBC_ENV})


def test_the_workers_fix_timed_in_fresh_runs_is_judged_in_throughput():
    """The fixed runs' median step is 40 ms, but one step in ten waits 400 ms for a worker: the clock
    sees 76 ms a step, so the saving is the throughput's (about 24 ms of a 100 ms step), not the
    median's 60 ms."""

    class Spiky(FakeRunner):
        def __call__(self, spec: RunSpec) -> RunResult:
            self.specs.append(spec)
            if not workers_on(spec):
                return RunResult(0, None, steps(0.1), [], {}, None, 1.0)
            run = steps(0.04)
            run[4] = StepRecord(index=4, start_s=0.16, total_s=0.4)
            return RunResult(0, None, run, [], {}, None, 1.0)

    result = loader_profiled()
    wk.maybe_confirm(RunSpec(["python", "t.py"]), result, Spiky(0.1, 0.04, fixed=workers_on), cores=2)
    record = result.data[wk.KEY]
    assert record["throughput"]["estimate"] == pytest.approx(0.1 / 0.076)
    assert record["interval"]["estimate"] == pytest.approx(2.5)  # the median's, kept beside
    f = workers_finding(result)
    assert f.est_saving_s == pytest.approx(0.1 * (1 - 0.076 / 0.1))
    assert "in throughput" in f.evidence


# ----------------------------------------------------------------- when the rounds end (a fake clock)


class Clock:
    t = 0.0

    def __call__(self):
        return self.t


class TimedRunner(FakeRunner):
    """``FakeRunner`` whose every run takes ``RUN_S`` on ``clock``."""

    RUN_S = 2.0

    def __init__(self, clock, *args, **kw):
        super().__init__(*args, **kw)
        self.clock = clock

    def __call__(self, spec: RunSpec) -> RunResult:
        self.clock.t += self.RUN_S
        return super().__call__(spec)


def confirm_on_clock(monkeypatch, which, kept, budget_s=None):
    """The page-fault or workers confirmation of a 100 ms step against ``kept`` s with the fix, each run
    ``TimedRunner.RUN_S`` on a fake clock, within ``budget_s`` (default: the confirmation's own)."""
    import functools

    clock = Clock()
    spec = RunSpec(["python", "t.py"])
    if which == "host_memory":
        runner = TimedRunner(clock, 0.1, kept)
        return mc.two_process(spec, runner, budget_s or mc.BUDGET_S, clock), runner
    monkeypatch.setattr(wk, "timed", functools.partial(fresh_runs.timed, clock=clock))
    runner = TimedRunner(clock, 0.1, kept, fixed=workers_on)
    return wk.two_process(spec, 1, runner, budget_s or wk.BUDGET_S), runner


@pytest.mark.parametrize("which", ["host_memory", "workers"])
def test_a_clearly_decided_confirmation_stops_after_the_minimum_rounds(monkeypatch, which):
    record, runner = confirm_on_clock(monkeypatch, which, kept=0.08)
    assert record["verdict"] == "helped" and record["rounds"] == fresh_runs.MIN_ROUNDS < fresh_runs.MAX_ROUNDS
    assert len(runner.specs) == 2 * fresh_runs.MIN_ROUNDS  # the budget held more rounds: left unspent
    assert runner.clock.t == 2 * fresh_runs.MIN_ROUNDS * TimedRunner.RUN_S < record["budget_s"]


@pytest.mark.parametrize("which", ["host_memory", "workers"])
def test_an_undecided_confirmation_runs_on_to_its_last_round_or_the_budget(monkeypatch, which):
    record, runner = confirm_on_clock(monkeypatch, which, kept=0.1)  # no gain, runs 3% apart
    assert record["verdict"] == "undecided" and record["rounds"] == fresh_runs.MAX_ROUNDS
    assert len(runner.specs) == 2 * fresh_runs.MAX_ROUNDS
    # 10 s hold two rounds of 4 s, not a third
    record, runner = confirm_on_clock(monkeypatch, which, kept=0.1, budget_s=10.0)
    assert record["verdict"] == "undecided" and record["rounds"] == 2 and len(runner.specs) == 4
