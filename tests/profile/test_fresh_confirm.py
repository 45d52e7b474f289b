"""The model probes' predictions (autocast, channels_last) timed again in fresh runs when they would warn
(fake runner: no child process), and judged by that interval."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from pitstop.findings import Severity
from pitstop.profile.analyze.rules import findings_for
from pitstop.profile.confirm import fresh_confirm as fc
from pitstop.profile.confirm.fresh_runs import WARMUP
from pitstop.profile.record.overrides import Overrides
from pitstop.profile.record.timeline import StepRecord
from pitstop.profile.runs.runner import RunResult, RunSpec

JITTER = [1.0, 1.02, 0.98, 1.01, 0.99, 1.03, 0.97, 1.0, 1.01, 0.99]
STEP = 0.1


def steps(total, n=20, backward=0.0):
    """``backward``: the backward's share of the step (the forward is half of it)."""
    return [
        StepRecord(
            index=i,
            start_s=i * total,
            total_s=total * JITTER[i % len(JITTER)],
            forward_s=total / 2,
            backward_s=total * backward,
        )
        for i in range(n)
    ]


# the in-process probe: fp32 60 ms vs bf16 30 ms of a 100 ms step, its interval wholly above 5% of it
AMP = {
    "dtype": "bfloat16",
    "base_s": 0.06,
    "new_s": 0.03,
    "saving_s": 0.03,
    "saving_lo_s": 0.026,
    "saving_hi_s": 0.034,
}
CL = {"base_s": 0.06, "new_s": 0.05, "saving_s": 0.01, "saving_lo_s": 0.008, "saving_hi_s": 0.012}
MODEL = {"name": "Net", "conv2d_layers": 2, "param_dtypes": ["float32"], "first_location": "train.py:30"}


def profiled(**probes):
    data = {"probes": {k: dict(v) for k, v in probes.items()}, "models": [MODEL], "device": "cpu"}
    return RunResult(0, None, steps(STEP), [], {}, None, 5.0, data=data)


def finding(result, fid="precision.amp"):
    found, _ = findings_for(result.steps, result.data, cores=2)
    return next(f for f in found if f.id == fid)


class Runner:
    """Step times by configuration: ``fixed`` s where ``on(spec)``, ``plain`` s otherwise; each run its
    own speed factor, as fresh processes have."""

    def __init__(self, plain, fixed, on=lambda s: bool(s.overrides.autocast), fail_fixed=False):
        self.plain, self.fixed, self.on, self.fail_fixed, self.specs = plain, fixed, on, fail_fixed, []

    def __call__(self, spec: RunSpec) -> RunResult:
        self.specs.append(spec)
        if self.on(spec) and self.fail_fixed:
            return RunResult(
                1, "RuntimeError: expected scalar type BFloat16", [], [], {}, None, 1.0, status="failed"
            )
        f = (1.0, 1.04, 0.97, 1.02)[len(self.specs) % 4]
        return RunResult(0, None, steps((self.fixed if self.on(spec) else self.plain) * f), [], {}, None, 1.0)


def test_only_a_model_probe_that_warns_in_process_is_timed_again():
    assert fc.model_probes_to_time(profiled(precision=AMP)) == ["amp"]
    assert fc.model_probes_to_time(profiled(precision=AMP, channels_last=CL)) == ["amp", "channels_last"]
    small = {**AMP, "saving_s": 0.002, "new_s": 0.058, "saving_lo_s": 0.001, "saving_hi_s": 0.003}
    assert fc.model_probes_to_time(profiled(precision=small)) == []  # info already: nothing to confirm
    wide = {**AMP, "saving_lo_s": -0.01}
    assert fc.model_probes_to_time(profiled(precision=wide)) == []  # in-process interval not confirming
    assert fc.model_probes_to_time(profiled(precision={**AMP, "two_process": {"rounds": 0}})) == []


def test_fix_overrides_are_what_fix_injects_on_top_of_the_runs_own():
    base = Overrides(dataloader={"num_workers": 2})
    assert fc.fix_overrides("amp", AMP, base) == Overrides(dataloader={"num_workers": 2}, autocast="bfloat16")
    assert fc.fix_overrides("channels_last", CL) == Overrides(channels_last=True)


def test_fresh_runs_alternate_the_script_as_it_is_and_with_autocast_injected():
    result = profiled(precision=AMP)
    runner = Runner(plain=STEP, fixed=0.08)
    assert fc.confirm_all(RunSpec(["python", "t.py"], env={"A": "1"}), result, runner) == ["amp"]
    on = [bool(s.overrides.autocast) for s in runner.specs]
    assert on[:4] == [False, True, True, False] and fc.MIN_ROUNDS * 2 <= len(on) <= fc.MAX_ROUNDS * 2
    assert all(s.env["A"] == "1" and not s.probes and s.steps == fc.STEPS for s in runner.specs)
    assert {s.overrides.autocast for s in runner.specs} == {None, "bfloat16"}
    two = result.data["probes"]["precision"]["two_process"]
    assert two["variant"] == "autocast=bfloat16" and two["saving_s"] == pytest.approx(0.02, rel=0.25)


def test_a_smaller_gain_in_fresh_runs_replaces_the_probes_prediction():
    # the probe promised 30 ms (1.43x); the fresh runs measure 20 ms (1.25x): the warning says 20 ms
    result = profiled(precision=AMP)
    fc.confirm_all(RunSpec(["python", "t.py"]), result, Runner(plain=STEP, fixed=0.08))
    f = finding(result)
    assert f.severity is Severity.WARN and f.data["confirmed"] is True
    assert f.est_saving_s == pytest.approx(0.02, rel=0.25)
    lo, hi = f.data["saving_ci_s"]
    assert 0.005 <= lo <= f.est_saving_s <= hi and [lo, hi] != [AMP["saving_lo_s"], AMP["saving_hi_s"]]
    assert "fresh runs of the script, as it is vs autocast=bfloat16" in f.evidence


def test_no_gain_in_fresh_runs_leaves_the_warning_info():
    result = profiled(precision=AMP)
    fc.confirm_all(RunSpec(["python", "t.py"]), result, Runner(plain=STEP, fixed=STEP))
    f = finding(result)
    assert f.severity is Severity.INFO and f.data["confirmed"] is False and "not confirmed" in f.evidence
    assert f.est_saving_s == pytest.approx(0.0, abs=0.005)


def test_fresh_runs_that_fail_with_the_fix_say_so_and_leave_the_finding_info():
    result = profiled(precision=AMP)
    fc.confirm_all(RunSpec(["python", "t.py"]), result, Runner(plain=STEP, fixed=0.08, fail_fixed=True))
    f = finding(result)
    assert f.severity is Severity.INFO and f.data["confirmed"] is False and f.data["saving_ci_s"] is None
    assert (
        "the fresh runs with the fix measured nothing (RuntimeError: expected scalar type BFloat16"
        in f.evidence
    )


def test_channels_last_is_timed_with_channels_last_injected():
    result = profiled(channels_last=CL)
    runner = Runner(plain=STEP, fixed=0.09, on=lambda s: s.overrides.channels_last)
    assert fc.confirm_all(RunSpec(["python", "t.py"]), result, runner) == ["channels_last"]
    f = finding(result, "memory_format.channels_last")
    assert f.severity is Severity.WARN and "as it is vs channels_last=True" in f.evidence


def test_a_failed_profile_run_times_nothing():
    result = profiled(precision=AMP)
    result.status, result.error = "failed", "boom"
    runner = Runner(plain=STEP, fixed=0.08)
    assert fc.confirm_all(RunSpec(["python", "t.py"]), result, runner) == [] and runner.specs == []


# ------------------------------------------------------------------------------------------ slow steps


def test_slow_steps_get_shorter_runs_and_a_budget_scaled_with_the_step_capped():
    assert fc.run_shape(profiled(precision=AMP)) == (fc.STEPS, fc.BUDGET_S)  # 100 ms steps: as before
    slow = profiled(precision=AMP)
    slow.steps = steps(1.0)
    n, budget = fc.run_shape(slow)
    assert n == fc.MIN_STEPS and fc.BUDGET_S < budget <= fc.BUDGET_CAP_S
    slow.steps = steps(4.0)
    assert fc.run_shape(slow) == (fc.MIN_STEPS, fc.BUDGET_CAP_S)


class SlowRunner:
    """``step_of(spec)`` seconds a step (default: 1 s plain, 0.5 s with autocast), ``spec.steps`` of them
    a run; each run advances ``clock`` by ``run_s`` (a start-up and steps that leave room for one round)."""

    def __init__(self, clock, run_s, step_of=lambda spec: 0.5 if spec.overrides.autocast else 1.0):
        self.clock, self.run_s, self.step_of, self.specs = clock, run_s, step_of, []

    def __call__(self, spec: RunSpec) -> RunResult:
        self.specs.append(spec)
        self.clock.t += self.run_s
        return RunResult(0, None, steps(self.step_of(spec), n=spec.steps), [], {}, None, self.run_s)


@pytest.fixture
def clock(monkeypatch):
    """A fake clock the fresh runs' budget is read from (``SlowRunner`` advances it)."""
    import functools

    from pitstop.profile.confirm import fresh_runs

    class Clock:
        t = 0.0

        def __call__(self):
            return self.t

    c = Clock()
    monkeypatch.setattr(fc, "timed", functools.partial(fresh_runs.timed, clock=c))
    return c


def test_one_round_of_slow_fresh_runs_decides_where_the_in_process_interval_agrees(clock):
    """The ImageNet-style case: a 2x autocast gain measured in process (rounds, an interval) and in one
    round of fresh runs (the budget holds no more): decided by blocks of steps within the runs."""
    amp = {"dtype": "bfloat16", "base_s": 0.9, "new_s": 0.45, "saving_s": 0.45}
    result = profiled(precision={**amp, "saving_lo_s": 0.38, "saving_hi_s": 0.5, "interval_text": "2.00x"})
    result.steps = steps(1.0, backward=0.45)  # compute-bound: forward and backward are 95% of the step
    _, budget = fc.run_shape(result)
    runner = SlowRunner(clock, run_s=0.3 * budget)
    assert fc.confirm_all(RunSpec(["python", "t.py"]), result, runner) == ["amp"]
    assert len(runner.specs) == 2 and all(s.steps == fc.MIN_STEPS for s in runner.specs)  # one round
    two = result.data["probes"]["precision"]["two_process"]
    assert two["rounds"] == 1 and "saving_lo_s" not in two and two["blocks_interval"]["method"] == "blocks"
    f = finding(result)
    assert f.severity is Severity.WARN and f.data["confirmed"] is True and f.data["verdict"] == "helped"
    lo, hi = f.data["saving_ci_s"]
    assert 0.05 <= lo < f.est_saving_s < hi
    assert "blocks of 3 steps within the runs" in f.evidence and "2.00x" in f.evidence
    # the same fresh runs without an agreeing in-process interval: no interval, info, saying why
    from pitstop.profile.analyze import confirm
    from pitstop.profile.record.timeline import breakdown

    alone = confirm.confirm(
        replace(f, severity=Severity.WARN, data={**amp, "two_process": two}), breakdown(result.steps)
    )
    assert alone.severity is Severity.INFO and alone.data["saving_ci_s"] is None
    assert "too few rounds of fresh runs fitted their budget (1 round(s)" in alone.evidence


def test_the_imagenet_case_heads_the_report_with_autocast_as_a_warning_with_an_interval(clock):
    """The case the issue saw (ResNet-18, ~1 s steps, AMX CPU): bf16 892 -> 422 ms in process over 3
    rounds, 996 -> 502 ms in one round of fresh runs; channels_last 1.11x in process. The hardware's
    part is faked (these numbers), the decision is the real one: autocast heads the report, a warning
    with an interval; channels_last follows; no pass anywhere without an interval under the bar."""
    amp = {"dtype": "bfloat16", "base_s": 0.892, "new_s": 0.422, "saving_s": 0.47}
    amp.update(saving_lo_s=0.40, saving_hi_s=0.52, interval_text="2.11x (95% CI 1.81-2.37, 3 rounds)")
    cl = {"base_s": 0.892, "new_s": 0.804, "saving_s": 0.088, "saving_lo_s": 0.06, "saving_hi_s": 0.11}
    result = profiled(precision=amp, channels_last=cl)
    result.steps = steps(0.996)
    _, budget = fc.run_shape(result)

    def step_of(spec):
        return 0.502 if spec.overrides.autocast else 0.897 if spec.overrides.channels_last else 0.996

    assert fc.confirm_all(RunSpec(["python", "t.py"]), result, SlowRunner(clock, 0.3 * budget, step_of)) == [
        "amp",
        "channels_last",
    ]
    report = result.report()
    ranked = report.ranked()
    top = ranked[0]
    assert top.id == "precision.amp" and top.severity is Severity.WARN, [(f.id, f.severity) for f in ranked]
    lo, hi = top.data["saving_ci_s"]
    assert 0.05 * 0.996 <= lo <= top.est_saving_s <= hi
    assert "6 steps a run, a budget of" in top.evidence and "scaled with the step" in top.evidence
    assert [f.id for f in ranked].index("memory_format.channels_last") == 1
    for f in report.findings:
        if f.severity is Severity.WARN:
            assert f.data.get("saving_ci_s"), f
        if f.severity is Severity.PASS and "saving_s" in (f.data or {}):
            assert f.data["saving_ci_s"][1] < 0.05 * 0.996, f


# ------------------------------------------------------------------------------- the shared time budget


def test_confirmation_runs_stop_at_the_end_of_their_measured_window():
    result = profiled(precision=AMP)
    runner = Runner(plain=STEP, fixed=0.08)
    assert fc.confirm_all(RunSpec(["python", "t.py"], full=True, trace=True), result, runner, budget_s=60.0)
    assert runner.specs
    for s in runner.specs:  # a fresh run is stopped after its steps, never run to the script's end
        assert not s.full and s.steps == fc.STEPS and s.warmup == WARMUP
        assert not s.probes and not s.trace and s.timeout is not None and s.timeout <= 60.0


def test_the_plan_is_said_before_the_runs_and_recorded_with_what_each_took():
    said: list[str] = []
    result = profiled(precision=AMP, channels_last=CL)
    runner = Runner(plain=STEP, fixed=0.08, on=lambda s: bool(s.overrides.autocast or s.overrides.channels_last))
    assert fc.confirm_all(RunSpec(["python", "t.py"]), result, runner, say=said.append, budget_s=45.0) == [
        "amp",
        "channels_last",
    ]
    assert said[0].startswith("answer in about") and "(amp 27 s, channels_last 13 s)" in said[0]
    assert said[1].startswith("timing the")
    rec = result.data["answer_time"]
    # 40 s of 45 s less the reserve; a round is 2 x (3 s + 23 steps of 0.1 s): amp (30 ms predicted) two
    # rounds with spare, channels_last (10 ms) the one round its blocks decide, amp what is left
    assert rec["budget_s"] == 45.0 and rec["planned"] == pytest.approx({"amp": 26.75, "channels_last": 13.25})
    assert rec["predicted_saving_s"] == pytest.approx({"amp": 0.03, "channels_last": 0.01})
    assert set(rec["confirm_spent_s"]) == {"amp", "channels_last"}
    assert result.data["probes"]["precision"]["two_process"]["budget_s"] == pytest.approx(26.75, abs=0.5)


def test_the_confirmation_with_the_biggest_predicted_saving_runs_first():
    small_amp = {**AMP, "new_s": 0.05, "saving_s": 0.01, "saving_lo_s": 0.008, "saving_hi_s": 0.012}
    big_cl = {**CL, "new_s": 0.03, "saving_s": 0.03, "saving_lo_s": 0.026, "saving_hi_s": 0.034}
    result = profiled(precision=small_amp, channels_last=big_cl)
    runner = Runner(plain=STEP, fixed=0.08, on=lambda s: bool(s.overrides.autocast or s.overrides.channels_last))
    said: list[str] = []
    ran = fc.confirm_all(RunSpec(["python", "t.py"]), result, runner, say=said.append, budget_s=60.0)
    assert ran == ["channels_last", "amp"]
    assert runner.specs[1].overrides.channels_last and not runner.specs[-1].overrides.channels_last
    assert list(result.data["answer_time"]["planned"]) == ["channels_last", "amp"]
    assert said[0].index("channels_last ") < said[0].index("amp ")


class Spends:
    """Fake confirmations on the fake ``clock``: each run takes ``took[name]`` s (default its whole
    share) and records the share it was given."""

    def __init__(self, clock, took=None):
        self.clock, self.took, self.got, self.skipped = clock, took or {}, {}, {}

    def __call__(self, name, saving, min_rounds):
        def run(b):
            self.got[name] = b
            self.clock.t += self.took.get(name, b)

        return fc.Confirmation(
            name, name, 90.0, 20, run, lambda rec: self.skipped.update({name: rec}), saving, min_rounds
        )


@pytest.mark.parametrize("took", [{}, {"workers": 20.0}, {"workers": 20.0, "amp": 15.0}])
def test_shares_go_by_what_is_at_stake_and_none_takes_more_than_its_share_plus_what_was_left(
    monkeypatch, clock, took
):
    """slow_loader's case: the data wait (60 ms of the step) is confirmed first with two rounds; amp
    (10 ms, one round decides by its blocks) next; the page faults (4 ms) need two rounds, which do not
    fit what is left: not run, saying why, unless the ones before left it room."""
    result = profiled()  # a round of 20 steps: 2 x (3 s + 23 steps of 0.1 s) = 10.6 s
    fake = Spends(clock, took)
    todo = [fake("workers", 0.06, 2), fake("amp", 0.01, 1), fake("host_memory", 0.004, 2)]
    monkeypatch.setattr(fc, "confirmations", lambda *a: todo)
    said: list[str] = []
    fc.confirm_all(RunSpec(["python", "t.py"]), result, say=said.append, budget_s=60.0, clock=clock)
    rec = result.data["answer_time"]
    # 55 s: workers two rounds with spare (26.5 s), amp two (26.5 s), host_memory's two do not fit: the
    # 2 s left go to workers
    assert rec["planned"] == pytest.approx({"workers": 28.5, "amp": 26.5, "host_memory": 0.0})
    assert re.search(r"\(workers 2\d s, amp 2\d s, host_memory only on time left over\)", said[0])
    names, left = list(rec["planned"]), 55.0
    for i, name in enumerate(n for n in names if n in fake.got):  # its share plus what the earlier ones left
        later = sum(rec["planned"][n] for n in names[i + 1 :])
        assert rec["planned"][name] <= fake.got[name] == pytest.approx(min(90.0, left - later))
        left -= took.get(name, fake.got[name])
    assert sum(rec["confirm_spent_s"].values()) <= 55.0 + 1e-9
    (why,) = fake.skipped["host_memory"]["errors"]
    if "amp" in took:  # 20 s left: one round, not the two an interval needs
        assert "hold one round of fresh runs" in why and "not the 2 an interval needs" in why
        assert "after the confirmations with bigger predicted savings" in why  # workers and amp ran first
    else:
        assert why.startswith("not run: one round of fresh runs") and "more than the 0 s left" in why
    assert rec["confirm_spent_s"]["host_memory"] == 0.0


def test_a_confirmation_skipped_first_in_order_does_not_blame_bigger_ones(monkeypatch, clock):
    """15 s left after the reserve hold one round of 10.6 s, not the two an interval needs: the first to
    run is not run, and nothing before it took time, so its record says its seconds are too few, not
    that bigger confirmations took them; so for the one after it, when nothing before it ran either."""
    fake = Spends(clock)
    todo = [fake("workers", 0.06, 2), fake("host_memory", 0.004, 2)]
    monkeypatch.setattr(fc, "confirmations", lambda *a: todo)
    assert fc.confirm_all(RunSpec(["python", "t.py"]), profiled(), budget_s=20.0, clock=clock) == []
    for name in ("workers", "host_memory"):
        (why,) = fake.skipped[name]["errors"]
        assert why.startswith("not run: the 15 s left of the 20 s budget hold one round of fresh runs")
        assert "not the 2 an interval needs" in why and "bigger" not in why


def test_a_confirmation_whose_round_does_not_fit_is_not_run_and_its_finding_says_so():
    result = profiled(precision=AMP)
    runner = Runner(plain=STEP, fixed=0.08)
    assert fc.confirm_all(RunSpec(["python", "t.py"]), result, runner, budget_s=12.0) == []
    assert runner.specs == []  # 7 s left after the reserve; a round is 2 x (3 s + 23 steps of 0.1 s)
    f = finding(result)
    assert f.severity is Severity.INFO and f.data["confirmed"] is False and f.data["saving_ci_s"] is None
    assert "not run: one round of fresh runs" in f.evidence and "--budget S allows more" in f.evidence
    assert result.data["answer_time"]["confirm_spent_s"] == {"amp": 0.0}


def test_without_a_budget_each_confirmation_keeps_its_own():
    result = profiled(precision=AMP)
    fc.confirm_all(RunSpec(["python", "t.py"]), result, Runner(plain=STEP, fixed=0.08))
    assert result.data["probes"]["precision"]["two_process"]["budget_s"] == fc.BUDGET_S
    assert result.data["answer_time"]["planned"] == {"amp": fc.BUDGET_S}
    assert result.data["answer_time"]["budget_s"] is None
