"""pitstop fix's speed-up is throughput: every measured step counts, the slow ones too; the median step
stands beside it. And its num_workers candidates and pick are recipes.workers' answer."""

from __future__ import annotations

import pytest

from pitstop.findings import Finding, Severity
from pitstop.fix import FixConfig, build_candidates, fix_report, run_fix
from pitstop.measure import HELPED, NO_CHANGE
from pitstop.profile.record.overrides import Overrides
from pitstop.profile.record.timeline import StepRecord
from pitstop.profile.runs.runner import RunResult, RunSpec
from pitstop.recipes.workers import WorkerMachine, choose_workers


def result(times: list[float], config: dict) -> RunResult:
    steps = [StepRecord(index=i, start_s=sum(times[:i]), total_s=t) for i, t in enumerate(times)]
    return RunResult(0, None, steps, [1.0] * len(steps), config, None, 1.0 + sum(times), status="stopped")


class SpikyRunner:
    """amp halves the typical step but adds one slow step per run: the median says 2x, the clock 1x."""

    def __init__(self, config: dict) -> None:
        self.config = config

    def __call__(self, spec: RunSpec) -> RunResult:
        cfg = {**self.config, "overrides": spec.overrides.to_dict()}
        if spec.overrides.autocast:
            return result([0.05] * 19 + [1.05], cfg)
        return result([0.10] * 20, cfg)


@pytest.fixture
def fast_bf16(monkeypatch):
    """A CPU with fast bf16 whatever this one is: on one without it, ``fix`` does not time amp at all."""
    monkeypatch.setattr("pitstop.recipes.autocast.fast_amp_dtype", lambda device_type: "bfloat16")


def test_fix_prints_the_throughput_speedup_not_the_median_one(tmp_path, fast_bf16):
    r = run_fix(["python", "t.py"], FixConfig(candidates=("amp",)), runner=SpikyRunner({"models": [{}]}))
    (m,) = r.candidates
    assert m.median / r.baseline.median == pytest.approx(2.0)  # the median ratio: beside, not the figure
    assert m.speedup == pytest.approx(1.0)  # 20 steps in 2.0 s either way: steps per wall-clock second
    assert m.interval is not None and m.interval.estimate == pytest.approx(m.speedup)
    assert m.verdict == NO_CHANGE and r.chosen == []  # decided on throughput, not on the 2x median
    report, _ = fix_report(r)
    f = report.by_id("fix.amp")
    assert f.title.endswith("(1.00x)") and "2.00x" not in f.title
    assert f.evidence.index("1.00x (95% CI") < f.evidence.index("median step") < f.evidence.index("2.00x")
    assert "slow step(s) (spike) counted in the throughput" in f.evidence


def test_without_spikes_both_agree_and_the_fix_helps(tmp_path, fast_bf16):
    class Clean(SpikyRunner):
        def __call__(self, spec: RunSpec) -> RunResult:
            cfg = {**self.config, "overrides": spec.overrides.to_dict()}
            return result([0.05 if spec.overrides.autocast else 0.10] * 20, cfg)

    r = run_fix(["python", "t.py"], FixConfig(candidates=("amp",)), runner=Clean({"models": [{}]}))
    (m,) = r.candidates
    assert m.verdict == HELPED and m.speedup == pytest.approx(2.0) and r.speedup == pytest.approx(2.0)


def loader_config(tmp_path) -> dict:
    script = tmp_path / "train.py"
    script.write_text("from torch.utils.data import DataLoader\nloader = DataLoader([1], num_workers=0)\n")
    return {"loaders": [{"location": f"{script}:2", "num_workers": 0, "batches_seen": 9, "wait_s": 1.0}]}


@pytest.fixture
def six_cores(monkeypatch):
    """A fabricated machine: 6 usable cores, no other load measured."""
    monkeypatch.setattr("pitstop.recipes.workers.usable_cores", lambda: 6)
    monkeypatch.setattr("pitstop.recipes.workers.affinity_cpus", lambda: 6)
    monkeypatch.setattr("pitstop.fix.core.usable_cores", lambda: 6)
    monkeypatch.setattr("pitstop.fix.runs.usable_cores", lambda: 6)
    return WorkerMachine(cores=6, torch_max=6)


def test_profile_and_fix_give_the_same_count_on_one_machine(tmp_path, six_cores):
    from pitstop.profile.analyze.rules import dataloader_rules
    from pitstop.profile.record.timeline import breakdown

    steps = [StepRecord(index=i, start_s=0.1 * i, total_s=0.1, data_wait_s=0.08) for i in range(10)]
    loaders = [{"num_workers": 0, "batches_seen": 10, "wait_s": 0.8, "location": "t.py:2"}]
    (found,) = [
        f for f in dataloader_rules(breakdown(steps), loaders, 6, "cpu") if f.id == "dataloader.workers"
    ]
    expected = choose_workers(six_cores).workers
    assert expected == 5 and found.data["suggested_workers"] == expected
    assert f"num_workers={expected}" in found.fix_code
    cands, _ = build_candidates([("workers", "dataloader.workers")], loader_config(tmp_path), FixConfig())
    assert cands[0].overrides.dataloader["num_workers"] == expected  # first: the same default
    assert [c.overrides.dataloader["num_workers"] for c in cands] == [5, 6]  # and the cap


def test_fix_picks_the_worker_count_from_its_measured_curve_through_recipes_workers(tmp_path, six_cores):
    def step(ov: Overrides) -> float:
        return {0: 0.10, 5: 0.050, 6: 0.049}[ov.dataloader.get("num_workers", 0)]

    class Runner:
        def __call__(self, spec: RunSpec) -> RunResult:
            cfg = {**loader_config(tmp_path), "overrides": spec.overrides.to_dict()}
            return result([step(spec.overrides)] * 20, cfg)

    r = run_fix(["python", "t.py"], FixConfig(candidates=("workers",)), runner=Runner())
    assert {c.name: c.verdict for c in r.candidates} == {"num_workers=5": HELPED, "num_workers=6": HELPED}
    curve = {5: r.candidates[0].speedup, 6: r.candidates[1].speedup}
    assert choose_workers(six_cores, curve, 0.05).workers == 5
    assert r.chosen == ["num_workers=5"]  # 6 is 2% faster: within min_gain, the fewer workers win


def test_verify_times_the_count_the_finding_suggests():
    from pitstop.fix.verify import fix_config

    f = Finding("dataloader.workers", Severity.WARN, "t", data={"usable_cores": 6, "suggested_workers": 5})
    assert fix_config(f, "workers", 30.0).workers_values == (5,)


def test_tune_loader_on_the_same_machine_picks_through_the_same_function(six_cores):
    from pitstop.tune.loader import TuneConfig, tune_loader
    from pitstop.tune.loader_measure import LoaderPoint

    curve = {0: 10.0, 1: 20.0, 2: 30.0, 3: 40.0, 4: 50.0, 5: 60.0, 6: 61.0, 8: 90.0}

    def measure(s):
        rate = curve.get(s.num_workers, 60.0)
        return LoaderPoint(setting=s, batches_per_s=rate, windows=[rate], batches=10, seconds=10 / rate)

    r = tune_loader(object(), {"batch_size": 4}, TuneConfig(confirm_rounds=1), measure=measure)
    # the cap is the profile's (6 cores: 6); 6 is within 3% of 5; 8 is past the cap: reported, not chosen
    assert r.meta["worker_cap"] == 6 and r.chosen.num_workers == 5
    assert r.chosen.num_workers == choose_workers(six_cores, curve, 0.03).workers
    assert r.meta["workers_choice"]["faster_above_cap"] == 8
