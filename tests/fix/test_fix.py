"""pitstop fix: candidate choice, verdicts, combination and the DataLoader diff, with a fake runner
(deterministic), plus the patch editor on real files. Real re-runs of the examples are in
test_fix_examples.py."""

from __future__ import annotations

import math
import stat

import pytest

from pitstop.findings import Finding, Severity
from pitstop.fix import fix_report, run_fix
from pitstop.fix.core import (
    FixConfig,
    FixResult,
    Measured,
    build_candidates,
    judge,
    kinds_from_findings,
    parse_candidates,
)
from pitstop.fix.patch import apply_patch, dataloader_patch
from pitstop.profile.record.overrides import Overrides
from pitstop.profile.record.timeline import StepRecord
from pitstop.profile.runs.runner import RunResult, RunSpec


@pytest.fixture(autouse=True)
def _bf16_not_slower(monkeypatch):
    """The fake runners decide how fast autocast is; the check of this CPU's bf16 matmuls stays out."""
    monkeypatch.setattr("pitstop.recipes.autocast.slower_reason", lambda dtype, dev: None)


TRAIN = """import torch
from torch.utils.data import DataLoader

ds = list(range(10))
loader = DataLoader(ds, batch_size=4, shuffle=True, num_workers=0)
other = DataLoader(
    ds,
    batch_size=2,
)
"""


def make_result(
    step_s: float, loss: float = 1.0, config: dict | None = None, status: str = "stopped"
) -> RunResult:
    steps = [StepRecord(index=i, start_s=i * step_s, total_s=step_s) for i in range(6)]
    return RunResult(
        returncode=0,
        error=None,
        steps=steps,
        losses=[loss] * len(steps),
        config=config or {},
        callback_result=None,
        wall_s=1.0,
        status=status,
    )


class FakeRunner:
    """Step time as a function of the overrides; records every spec it was given."""

    def __init__(self, step_time, config: dict, loss=lambda ov: 1.0, jitter=None) -> None:
        self.step_time, self.config, self.loss, self.jitter = step_time, config, loss, jitter
        self.specs: list[RunSpec] = []

    def __call__(self, spec: RunSpec) -> RunResult:
        self.specs.append(spec)
        ov = spec.overrides
        t = self.step_time(ov)
        if self.jitter:
            t *= self.jitter[len(self.specs) % len(self.jitter)]
        cfg = {**self.config, "overrides": ov.to_dict()}
        return make_result(t, self.loss(ov), cfg)


def loader_config(tmp_path, workers: int = 0) -> dict:
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    return {
        "loaders": [
            {"location": f"{script}:5", "num_workers": workers, "batches_seen": 10, "wait_s": 2.0},
        ],
        "models": [{"first_location": f"{script}:9"}],
        "optimizers": [{"type": "SGD", "location": f"{script}:10"}],
        "device": None,
    }


# ------------------------------------------------------------------------------------------- candidates


def test_parse_candidates():
    assert parse_candidates("auto") is None
    assert "compile" in parse_candidates("all")
    assert parse_candidates("workers, amp") == ("workers", "amp")
    with pytest.raises(ValueError, match="unknown candidate"):
        parse_candidates("workers,turbo")


def test_kinds_from_findings_keeps_actionable_ones_in_rank_order():
    findings = [
        Finding("precision.amp", Severity.WARN, "t", est_saving_s=0.1),
        Finding("dataloader.workers", Severity.ERROR, "t", est_saving_s=0.5),
        Finding("memory_format.channels_last", Severity.PASS, "t"),  # measured: no gain
        Finding("compile.none", Severity.INFO, "t"),
        Finding("dataloader.persistent_workers", Severity.WARN, "t"),
        Finding("sync.item", Severity.ERROR, "t"),  # no injectable fix
        Finding("host.page_faults", Severity.INFO, "t"),
    ]
    assert kinds_from_findings(findings) == [
        ("workers", "dataloader.workers"),
        ("amp", "precision.amp"),
        ("compile", "compile.none"),
        ("host_memory", "host.page_faults"),
    ]


def test_build_candidates_for_this_machine(tmp_path, monkeypatch):
    import pitstop.fix.core as fix_core

    monkeypatch.setattr(fix_core, "usable_cores", lambda: 4)
    monkeypatch.setattr("pitstop.recipes.autocast.preferred_amp_dtype", lambda dev: None)
    monkeypatch.setattr("pitstop.recipes.autocast.fast_amp_dtype", lambda dev: None)
    cands, skipped = build_candidates(
        [("workers", "dataloader.workers"), ("amp", "precision.amp"), ("cudnn_benchmark", "cudnn.benchmark")],
        loader_config(tmp_path),
        FixConfig(),
    )
    # recipes.workers: one core left to the training process (3), and the most 4 cores allow (4)
    assert [c.name for c in cands] == ["num_workers=3", "num_workers=4"]
    assert cands[0].overrides.dataloader == {"num_workers": 3, "persistent_workers": True}
    assert any(s.startswith("amp:") for s in skipped) and any(
        s.startswith("cudnn_benchmark:") for s in skipped
    )


# ---------------------------------------------------------------------------------------------- verdicts


def m(name: str, runs: list[float], losses: list[float] | None = None) -> Measured:
    """A configuration whose runs went at ``runs`` steps/s (five equal steps each)."""
    x = Measured(name, name, {})
    for i, r in enumerate(runs):
        x.record(make_result(1.0 / r, (losses or [1.0] * len(runs))[i]))
    return x


def test_judge_gives_the_engines_verdict_with_its_interval_and_checks_the_loss():
    cfg = FixConfig(min_gain=0.05, loss_rtol=0.1)
    base = m("base", [10, 10.5, 9.5])
    judge(base, base, cfg)
    assert base.verdict == "baseline" and base.median == pytest.approx(10)
    fast = m("fast", [13, 13.65, 12.35])  # 1.3x in every round
    judge(fast, base, cfg)
    assert fast.verdict == "helped" and fast.speedup == pytest.approx(1.3)
    assert fast.interval.lo == pytest.approx(1.3) and "above 1.05x" in fast.reason
    noisy = m("noisy", [14, 9.0, 12])  # 1.2x median, but one round slower: the interval spans 1
    judge(noisy, base, cfg)
    assert noisy.verdict == "undecided" and noisy.interval.lo < 1 < noisy.interval.hi
    flat = m("flat", [10.1, 10.6, 9.6])
    judge(flat, base, cfg)
    assert flat.verdict == "no change" and "within" in flat.reason
    slow = m("slow", [8, 8.4, 7.6])
    judge(slow, base, cfg)
    assert slow.verdict == "hurt" and slow.speed_only
    early = m("early", [13, 13.6])  # two rounds: below min_rounds, nothing is decided yet
    judge(early, base, cfg)
    assert early.verdict == "undecided"
    diverged = m("diverged", [20, 21, 22], losses=[3.0, 3.1, 2.9])
    judge(diverged, base, cfg)
    assert diverged.verdict == "rejected" and "loss" in diverged.reason
    skipped = m("skipped", [20, 21, 22])
    skipped.skipped = ["persistent_workers: needs num_workers > 0"]
    judge(skipped, base, cfg)
    assert skipped.verdict == "rejected" and "did not apply" in skipped.reason
    broken = Measured("broken", "compile", {})
    broken.errors = ["RuntimeError: boom"]
    judge(broken, base, cfg)
    assert broken.verdict == "failed"


def test_judge_after_the_rounds_calls_a_sure_gain_under_the_margin_helped_and_says_so():
    """Twelve rounds of a gain of 1.02x or 1.10x: the 95% interval spans 1.05, the 99% one lies above 1,
    and the judge runs once the rounds are over, so the last look calls it helped."""
    cfg = FixConfig(min_gain=0.05)
    rates = [10.0, 10.4, 9.7, 10.2, 9.9, 10.1, 10.3, 9.8, 10.0, 10.5, 9.6, 10.2]
    base = m("base", rates)
    judge(base, base, cfg)
    gain = m("gain", [r * (1.02 + 0.08 * (i % 2)) for i, r in enumerate(rates)])
    judge(gain, base, cfg)
    assert gain.verdict == "helped" and 1.0 < gain.interval.lo <= 1.05
    assert "99% interval lies above 1.00x" in gain.reason and "under 5%" in gain.reason


def test_non_finite_loss_rejects():
    base = m("b", [10.0])
    cand = Measured("c", "amp", {})
    cand.record(make_result(0.05, math.nan))
    judge(base, base, FixConfig())
    judge(cand, base, FixConfig())
    assert cand.verdict == "rejected" and "non-finite" in cand.reason


# -------------------------------------------------------------------------------------------- run_fix


def test_fix_measures_keeps_what_helps_rejects_the_rest_and_writes_a_diff(tmp_path, monkeypatch):
    import pitstop.fix.core as fix_core

    monkeypatch.setattr(fix_core, "usable_cores", lambda: 2)
    config = loader_config(tmp_path)

    def step_time(ov: Overrides) -> float:
        t = 0.10
        if ov.dataloader.get("num_workers") == 1:
            t -= 0.05  # the planted problem: data loading
        if ov.dataloader.get("num_workers") == 2:
            t -= 0.051  # 2% faster than 1 worker: recipes.workers keeps the fewer
        return t  # channels_last does nothing (an MLP)

    runner = FakeRunner(step_time, config)
    r = run_fix(["python", "train.py"], FixConfig(candidates=("workers", "channels_last")), runner=runner)
    verdicts = {c.name: c.verdict for c in r.candidates if c.on_top_of is None}
    # 2 cores: recipes.workers' count (one core left to training) and its cap
    assert verdicts == {"num_workers=1": "helped", "num_workers=2": "helped", "channels_last": "no change"}
    # measured again with the loader fix in place (it may only have been hidden by the data wait): still no
    (again,) = [c for c in r.candidates if c.on_top_of]
    assert (
        again.name == "channels_last" and again.on_top_of == "num_workers=1" and again.verdict == "no change"
    )
    assert r.chosen == ["num_workers=1"]
    assert r.speedup == pytest.approx(2.0)
    # interleaved: baseline, candidates, baseline, ... (the first baseline run doubles as round 1's)
    names = [s.overrides.describe() for s in runner.specs]
    assert names[:4] == [
        "none",
        "num_workers=1, persistent_workers=True",
        "num_workers=2, persistent_workers=True",
        "channels_last=True",
    ]
    # every candidate decided after min_rounds (3) rounds; rotating order: round 2 starts with the next one
    assert names[4:8] == [
        "num_workers=1, persistent_workers=True",
        "num_workers=2, persistent_workers=True",
        "channels_last=True",
        "none",
    ]
    assert len(runner.specs) == 3 * 4 + 3 * 2  # round 2: num_workers=1 alone, and with channels_last
    assert all(s.steps == 20 and s.quiet for s in runner.specs)
    # the diff edits the DataLoader at train.py:5 and nothing else
    assert r.patch is not None
    assert "-loader = DataLoader(ds, batch_size=4, shuffle=True, num_workers=0)" in r.patch.diff
    assert (
        "+loader = DataLoader(ds, batch_size=4, shuffle=True, num_workers=1, persistent_workers=True)"
        in r.patch.diff
    )
    report, blocks = fix_report(r)
    ids = {f.id: f for f in report.findings}
    assert ids["fix.workers"].severity is Severity.WARN
    assert (
        ids["fix.channels_last"].severity is Severity.INFO and "no change" in ids["fix.channels_last"].title
    )
    w2 = next(f for f in report.findings if f.title.startswith("num_workers=1:"))
    assert "2.00x (95% CI 2.00\u20132.00, 3 rounds, 18 steps each side)" in w2.evidence
    assert r.interval is not None and r.interval.estimate == pytest.approx(2.0)
    assert report.sections["fix"]["candidates"][0]["interval"]["rounds"] == 3
    assert ids["fix.combined"].fix_code == r.patch.diff
    assert report.sections["fix"]["speedup"] == pytest.approx(2.0)
    assert sum(b.html.count("<circle") for b in blocks) == 4  # one interval per candidate, second round too


def test_fix_combines_fixes_that_helped(tmp_path):
    config = loader_config(tmp_path)

    def step_time(ov: Overrides) -> float:
        t = 0.12
        if ov.autocast:
            t -= 0.03
        if ov.optimizer_impl:
            t -= 0.02
        return t

    runner = FakeRunner(step_time, config)
    r = run_fix(["python", "train.py"], FixConfig(candidates=("amp", "foreach")), runner=runner)
    assert r.combined is not None
    assert set(r.chosen) == {"autocast bfloat16", "optimizer foreach"}
    assert r.speedup == pytest.approx(0.12 / 0.07)
    assert r.patch is None  # nothing local to patch: snippets only
    report, _ = fix_report(r)
    amp = report.by_id("fix.amp")
    assert "torch.autocast" in amp.fix_code and amp.location.endswith(":9")


def test_compute_fixes_are_measured_again_once_the_loader_fix_removes_the_data_wait(tmp_path):
    """The step is as long as the slower of data and compute: autocast cannot help while the script waits
    for data, and helps once more workers removed the wait. fix measures it again on top of the loader fix
    and recommends both; a candidate that changed the loss is not given a second chance."""
    config = loader_config(tmp_path)

    def step_time(ov: Overrides) -> float:
        data = 0.10 / max(1, ov.dataloader.get("num_workers", 0))
        compute = 0.05 - (0.02 if ov.autocast else 0.0)
        return max(data, compute)

    def loss(ov: Overrides) -> float:
        return 2.0 if ov.channels_last else 1.0  # channels_last "breaks" this model: rejected on loss

    cfg = FixConfig(candidates=("workers", "amp", "channels_last"), workers_values=(4,))
    r = run_fix(["python", "train.py"], cfg, runner=FakeRunner(step_time, config, loss=loss))
    first = {m.name: m for m in r.candidates if m.on_top_of is None}
    assert first["num_workers=4"].verdict == "helped"
    assert first["autocast bfloat16"].verdict == "no change"  # 0.10 s of data wait either way
    (top,) = [m for m in r.candidates if m.on_top_of]
    assert top.name == "autocast bfloat16" and top.on_top_of == "num_workers=4"
    assert top.verdict == "helped" and top.speedup == pytest.approx(0.05 / 0.03)
    assert top.overrides["dataloader"]["num_workers"] == 4 and top.overrides["autocast"] == "bfloat16"
    assert set(r.chosen) == {"num_workers=4", "autocast bfloat16"}
    assert r.speedup == pytest.approx(0.10 / 0.03)  # the combination, measured against the script as it is
    report, _ = fix_report(r)
    amp = [f for f in report.findings if f.id == "fix.amp"]
    helped = next(f for f in amp if f.severity is Severity.WARN)
    assert "(with num_workers=4)" in helped.title and "num_workers=4 alone" in helped.evidence


def test_a_combination_slower_than_the_best_single_fix_in_the_same_round_is_not_recommended(tmp_path):
    def step_time(ov: Overrides) -> float:
        if ov.autocast and ov.optimizer_impl:
            return 0.11  # each helps alone, together they get in each other's way
        return 0.12 - (0.03 if ov.autocast else 0.0) - (0.02 if ov.optimizer_impl else 0.0)

    runner = FakeRunner(step_time, loader_config(tmp_path))
    r = run_fix(["python", "train.py"], FixConfig(candidates=("amp", "foreach")), runner=runner)
    assert r.chosen == ["autocast bfloat16"] and r.speedup == pytest.approx(0.12 / 0.09)
    # the single fix was re-run interleaved with the combination: baseline, single, combination
    tail = [s.overrides.describe() for s in runner.specs[-9:]]
    assert tail[:3] == ["none", "autocast=bfloat16", "autocast=bfloat16, optimizer_impl=foreach"]
    report, _ = fix_report(r)
    assert (
        "was not faster than autocast bfloat16 alone in the same rounds"
        in report.by_id("fix.combined").evidence
    )


def test_auto_mode_profiles_first_and_uses_its_findings(tmp_path, monkeypatch):
    config = loader_config(tmp_path)
    runner = FakeRunner(lambda ov: 0.05 if ov.channels_last else 0.1, config)

    def report(self):
        from pitstop.findings import Report

        return Report(
            tool="profile",
            findings=[Finding("memory_format.channels_last", Severity.WARN, "t", est_saving_s=0.05)],
        )

    monkeypatch.setattr(RunResult, "report", report)
    r = run_fix(["python", "train.py"], FixConfig(), runner=runner)
    assert runner.specs[0].probes is True  # the profile run
    assert [c.name for c in r.candidates] == ["channels_last"]
    assert r.chosen == ["channels_last"]


def test_a_compute_gain_too_small_to_try_first_is_tried_on_top_of_the_loader_fix(tmp_path, monkeypatch):
    """The profile measured autocast's gain, but on a data-bound step it was an info-level share: fix does not
    try it against the script as it is, and does try it once more workers removed the wait."""
    config = loader_config(tmp_path)
    monkeypatch.setattr("pitstop.fix.core.usable_cores", lambda: 4)
    monkeypatch.setattr("pitstop.recipes.autocast.preferred_amp_dtype", lambda dev: "bfloat16")
    monkeypatch.setattr("pitstop.recipes.autocast.fast_amp_dtype", lambda dev: "bfloat16")

    def step_time(ov: Overrides) -> float:
        return max(0.10 / max(1, ov.dataloader.get("num_workers", 0)), 0.05 - (0.02 if ov.autocast else 0.0))

    def report(self):
        from pitstop.findings import Report

        return Report(
            tool="profile",
            findings=[
                Finding("dataloader.workers", Severity.WARN, "t", est_saving_s=0.08),
                Finding("precision.amp", Severity.INFO, "t", est_saving_s=0.002),  # 2% of the step
                Finding("compile.none", Severity.INFO, "t"),  # never measured: not a hidden gain
            ],
        )

    monkeypatch.setattr(RunResult, "report", report)
    cfg = FixConfig(workers_values=(4,), skip=("compile",))
    r = run_fix(["python", "train.py"], cfg, runner=FakeRunner(step_time, config))
    assert [(c.name, c.on_top_of) for c in r.candidates] == [
        ("num_workers=4", None),
        ("autocast bfloat16", "num_workers=4"),
    ]
    assert set(r.chosen) == {"num_workers=4", "autocast bfloat16"}
    assert r.speedup == pytest.approx(0.10 / 0.03)


def test_a_script_that_fails_gives_an_error_finding(tmp_path):
    def runner(spec: RunSpec) -> RunResult:
        res = make_result(0.1, status="error")
        res.steps, res.error = [], "ValueError: bad path (at train.py:3)"
        return res

    r = run_fix(["python", "train.py"], FixConfig(candidates=("workers",)), runner=runner)
    report, _ = fix_report(r)
    f = report.by_id("fix.baseline")
    assert f.severity is Severity.ERROR and "bad path" in f.evidence
    assert report.error


# ---------------------------------------------------------------------------------------------- patch


def test_patch_replaces_existing_and_adds_missing_keywords(tmp_path):
    p = tmp_path / "train.py"
    p.write_text(TRAIN)
    patch = dataloader_patch(f"{p}:5", {"num_workers": 4, "pin_memory": True})
    new = patch.patched.splitlines()[4]
    assert new == "loader = DataLoader(ds, batch_size=4, shuffle=True, num_workers=4, pin_memory=True)"
    assert patch.patched.splitlines()[5:] == TRAIN.splitlines()[5:]
    ml = dataloader_patch(f"{p}:7", {"num_workers": 2})  # a line inside a multi-line call
    assert "    batch_size=2, num_workers=2,\n)" in ml.patched
    compile(ml.patched, "x", "exec")


def test_patch_errors_are_clear(tmp_path):
    p = tmp_path / "train.py"
    p.write_text(TRAIN)
    with pytest.raises(ValueError, match="no DataLoader"):
        dataloader_patch(f"{p}:1", {"num_workers": 2})
    with pytest.raises(ValueError, match="cannot read"):
        dataloader_patch(f"{tmp_path}/missing.py:3", {"num_workers": 2})
    with pytest.raises(ValueError, match="file:line"):
        dataloader_patch("train.py", {"num_workers": 2})


def test_apply_keeps_a_backup_and_the_file_mode(tmp_path):
    p = tmp_path / "train.py"
    p.write_text(TRAIN)
    p.chmod(0o755)
    patch = dataloader_patch(f"{p}:5", {"num_workers": 2})
    backup = apply_patch(patch)
    assert backup.read_text() == TRAIN
    assert "num_workers=2)" in p.read_text()
    assert stat.S_IMODE(p.stat().st_mode) == 0o755
    # a second patch made from the old text is refused: the file changed
    with pytest.raises(ValueError, match="changed"):
        apply_patch(patch)


def test_candidates_the_scripts_own_facts_rule_out(tmp_path):
    config = loader_config(tmp_path)
    config["models"] = [
        {"first_location": "train.py:9", "conv2d_layers": 0, "input_shapes": [[32, 256]], "autocast": True}
    ]
    config["optimizers"] = [{"type": "AdamW", "impl": "foreach"}]
    cands, skipped = build_candidates(
        [("channels_last", "requested"), ("amp", "requested"), ("foreach", "requested")], config, FixConfig()
    )
    (cl,) = cands
    assert cl.cannot_help and "no Conv2d" in cl.cannot_help  # still measured, then rejected
    assert any("already runs" in s for s in skipped) and any("already uses" in s for s in skipped)
    config["models"][0].update(conv2d_layers=3, input_shapes=[[8, 3, 32, 32]])
    (cl,) = build_candidates([("channels_last", "requested")], config, FixConfig())[0]
    assert cl.cannot_help is None


def test_host_memory_candidate_is_for_cpu_steps_and_must_really_apply(tmp_path):
    config = loader_config(tmp_path)
    (c,) = build_candidates([("host_memory", "host.page_faults")], config, FixConfig())[0]
    assert c.overrides == Overrides(keep_host_memory=True)
    cuda, skipped = build_candidates(
        [("host_memory", "host.page_faults")], {**config, "device": "cuda:0"}, FixConfig()
    )
    assert not cuda and "cuda" in skipped[0]
    done = {**config, "host_memory": "glibc keeps freed blocks up to 1024 MiB mapped (mallopt)"}
    assert not build_candidates([("host_memory", "requested")], done, FixConfig())[0]
    # A run whose override could not apply (jemalloc preloaded, malloc set by the user) is not credited.
    x = Measured("keep host memory", "host_memory", {"keep_host_memory": True})
    base = m("baseline", [10.0, 10.1, 9.9])
    failed = {
        "override_errors": ["keep_host_memory: off: jemalloc is preloaded and already keeps freed memory"]
    }
    for _ in range(3):
        x.record(make_result(0.05, config=failed))
    judge(x, base, FixConfig())
    assert x.verdict == "rejected" and "jemalloc" in x.reason


def cli(argv: list[str]) -> int:
    import argparse

    from pitstop.fix.cli import register

    parser = argparse.ArgumentParser(prog="pitstop")
    register(parser.add_subparsers(dest="command", required=True))
    ns = parser.parse_args(argv)
    return ns.func(ns)


def test_fix_cli_apply_writes_the_diff_with_a_backup(tmp_path, monkeypatch, capsys):
    import json

    import pitstop.fix.runs as fix_runs

    config = loader_config(tmp_path)
    script = tmp_path / "train.py"
    import pitstop.fix.apply_verify as applymod

    monkeypatch.setattr(fix_runs, "run", FakeRunner(lambda ov: 0.05 if ov.dataloader else 0.1, config))
    # the verification run of the patched script: as fast as the measured fix
    monkeypatch.setattr(applymod, "run", FakeRunner(lambda ov: 0.05, config))
    out = tmp_path / "fix.json"
    code = cli(
        [
            "fix",
            "--candidates",
            "workers",
            "--apply",
            "--yes",
            "--json",
            str(out),
            "--",
            "python",
            str(script),
        ]
    )
    assert code == 0
    assert "num_workers=" in script.read_text() and "persistent_workers=True" in script.read_text()
    assert (tmp_path / "train.py.pitstop.bak").read_text() == TRAIN
    d = json.loads(out.read_text())
    import jsonschema

    from pitstop.report.jsonfmt import load_schema

    jsonschema.validate(d, load_schema())
    assert d["tool"] == "fix" and d["sections"]["fix"]["diff"].startswith("--- a/")
    err = capsys.readouterr().err
    assert "backup at" in err and "2.00x in one run, inside 2.00x (95% CI" in err


def test_fix_cli_apply_without_a_terminal_needs_yes(tmp_path, monkeypatch, capsys):
    import pitstop.fix.runs as fix_runs

    config = loader_config(tmp_path)
    script = tmp_path / "train.py"
    monkeypatch.setattr(fix_runs, "run", FakeRunner(lambda ov: 0.05 if ov.dataloader else 0.1, config))
    monkeypatch.setattr("sys.stdin.isatty", lambda: False, raising=False)
    code = cli(["fix", "--candidates", "workers", "--apply", "-q", "--", "python", str(script)])
    assert code == 2 and "--yes" in capsys.readouterr().err
    assert script.read_text() == TRAIN


def test_the_budget_bounds_the_rounds_and_leaves_open_candidates_undecided(tmp_path):
    """Every run takes 40 s of a fake clock; a candidate whose speed-up flips between rounds stays open
    and is reported undecided with its interval when the 300 s budget ends."""
    clock = [0.0]
    base = FakeRunner(lambda ov: 0.1, loader_config(tmp_path), jitter=[1.0, 0.8, 1.25, 0.9, 1.1])

    def runner(spec: RunSpec) -> RunResult:
        clock[0] += 40.0
        return base(spec)

    progress: list[str] = []
    r = run_fix(
        ["python", "train.py"],
        FixConfig(candidates=("amp",), budget=300.0),
        runner=runner,
        progress=progress.append,
        clock=lambda: clock[0],
    )
    (amp,) = r.candidates
    assert amp.verdict == "undecided" and amp.interval is not None and amp.interval.rounds >= 2
    assert clock[0] <= 300.0 + 2 * 40.0  # the round that would not fit was not started
    assert any("ETA" in p and "round" in p for p in progress)
    report, _ = fix_report(r)
    f = report.by_id("fix.amp")
    assert "undecided" in f.title and "95% CI" in f.evidence


def test_a_run_the_budget_stopped_is_not_a_failure(tmp_path):
    config = loader_config(tmp_path)

    def runner(spec: RunSpec) -> RunResult:
        if spec.overrides.compile:
            res = make_result(0.1, status="timeout")
            res.steps, res.error = [], f"timed out after {spec.timeout:g} s"
            return res
        return make_result(0.1, config=config)

    r = run_fix(["python", "train.py"], FixConfig(candidates=("compile",)), runner=runner)
    (c,) = r.candidates
    assert c.verdict == "undecided" and "budget ended" in c.reason and not c.errors


def test_the_first_stage_keeps_the_budget_unless_a_later_stage_needs_some(tmp_path):
    """Runs take 10 s of a fake clock; autocast flips between rounds and never decides. Alone, it may use
    the whole budget; once more workers helped, the first stage stops at 60% so the second stage runs."""

    def make(kinds: tuple[str, ...]) -> tuple[FixResult, list[float], list[float]]:
        clock, stage1_end = [0.0], []
        inner = FakeRunner(
            lambda ov: 0.05 if ov.dataloader else 0.1, loader_config(tmp_path), jitter=[1.0, 0.8, 1.25]
        )

        def runner(spec: RunSpec) -> RunResult:
            clock[0] += 10.0
            if spec.overrides.dataloader and spec.overrides.autocast and not stage1_end:
                stage1_end.append(clock[0] - 10.0)  # the first run of the second stage
            return inner(spec)

        cfg = FixConfig(candidates=kinds, workers_values=(4,), budget=300.0, max_rounds=100)
        return run_fix(["python", "train.py"], cfg, runner=runner, clock=lambda: clock[0]), clock, stage1_end

    alone, clock, _ = make(("amp",))
    assert alone.candidates[0].verdict == "undecided" and clock[0] > 0.6 * 300 + 20
    both, _, stage1_end = make(("workers", "amp"))
    assert stage1_end and stage1_end[0] <= 0.6 * 300 + 30  # stopped after the round that crossed 60%
    assert any(c.on_top_of == "num_workers=4" for c in both.candidates)


def test_autocast_asked_for_on_a_cpu_whose_bf16_matmuls_measure_slower_is_skipped(
    tmp_path, monkeypatch, bf16less_cpu
):
    import pitstop.matmul

    monkeypatch.setattr("pitstop.recipes.autocast.slower_reason", pitstop.matmul.slower_reason)
    cands, skipped = build_candidates([("amp", "requested")], loader_config(tmp_path), FixConfig())
    assert not cands
    (why,) = skipped
    assert (
        why.startswith("amp: bf16 torch.mm 0.301 GFLOP/s vs fp32 89 GFLOP/s")
        and "emulated on this CPU" in why
    )
    assert max(n for _, n, _ in bf16less_cpu) <= 512  # the check stayed small


def test_steps_per_run_follow_the_baselines_start_up(tmp_path):
    """Without --steps, the first baseline run's start-up (wall time less its steps) sets the steps of
    every later run; a script that ended before its steps caps them at what it ran."""
    from pitstop.fix.runs import FIRST_STEPS, steps_from_run

    r = make_result(0.01)
    r.wall_s = 6.0 * 0.01 + 8.0  # 8 s of start-up for 0.01 s steps: the steps are cheap, use many
    r.steps = [StepRecord(index=i, start_s=i, total_s=0.01 * (1 + 0.2 * (i % 3))) for i in range(30)]
    r.spec = RunSpec(command=["python"], steps=30)
    big = steps_from_run(r)
    assert big is not None and 4 * FIRST_STEPS < big <= 200
    r.spec = RunSpec(command=["python"], steps=300)
    assert steps_from_run(r) == 30  # asked for 300, the script ended after 30: more would not come
    r.wall_s = 0.4  # start-up as short as the steps: the minimum
    assert steps_from_run(r) == FIRST_STEPS

    runner = FakeRunner(lambda ov: 0.1, loader_config(tmp_path))
    res = run_fix(["python", "train.py"], FixConfig(candidates=("channels_last",)), runner=runner)
    first, later = runner.specs[0].steps, {s.steps for s in runner.specs[1:]}
    assert first == FIRST_STEPS and len(later) == 1 and res.settings["steps"] in later
    pinned = FakeRunner(lambda ov: 0.1, loader_config(tmp_path))
    run_fix(["python", "train.py"], FixConfig(candidates=("channels_last",), steps=7), runner=pinned)
    assert {s.steps for s in pinned.specs} == {7}


def test_an_unconfirmed_page_fault_estimate_is_timed_by_fix_and_a_small_one_is_not():
    def faults(share, confirmed):
        data = {"confirmed": confirmed}
        return Finding("host.page_faults", Severity.INFO, "t", est_saving_s=0.01, share=share, data=data)

    # the in-process probe's point estimate reached a warning's share, its interval did not confirm it
    assert kinds_from_findings([faults(0.16, False)]) == [("host_memory", "host.page_faults")]
    assert kinds_from_findings([faults(0.02, False)]) == []  # too small to be worth a run
    assert kinds_from_findings([faults(0.16, None)]) == []  # a rule that did not judge it


def test_fix_cli_prints_its_diff_once_at_80_columns(tmp_path, monkeypatch, capsys):
    import pitstop.fix.runs as fix_runs

    config = loader_config(tmp_path)
    script = tmp_path / "train.py"
    monkeypatch.setattr(fix_runs, "run", FakeRunner(lambda ov: 0.05 if ov.dataloader else 0.1, config))
    monkeypatch.setenv("COLUMNS", "80")
    assert cli(["fix", "--candidates", "workers", "--", "python", str(script)]) == 0
    out = capsys.readouterr().out
    assert out.count("-loader = DataLoader(ds, batch_size=4, shuffle=True, num_workers=0)") == 1
    assert all(len(line) <= 80 for line in out.splitlines())


def test_fix_progress_shows_the_run_and_the_running_intervals(monkeypatch):
    import io

    from rich.console import Console
    from rich.progress import Progress as Bar

    import pitstop.fix.progress as fp
    from pitstop.measure import Interval, Progress

    made: list[Bar] = []

    def bar(label: str, show: bool, **kw: object) -> Bar:
        made.append(Bar(console=Console(file=io.StringIO(), width=80), auto_refresh=False))
        return made[-1]

    monkeypatch.setattr(fp, "progress_bar", bar)
    line = Progress(
        1, 4, 30.0, 90.0, {"amp": None, "workers=2": "helped"}, {"amp": Interval(1.31, 0.92, 1.7, 2, 9, 9)}
    )
    assert line.text() == "round 1/4, ETA 90 s; amp 1.31x [0.92, 1.70]; workers=2: helped"
    with fp.fix_progress(300.0, True) as update:
        update("candidates: run 1, amp (299 s of budget left)")
        update(f"candidates: {line.text()}")
    run, rounds = made[0].tasks
    assert run.description == "candidates: run 1, amp (299 s of budget left)" and run.total == 300.0
    assert rounds.description.startswith("candidates: round 1/4") and "[0.92, 1.70]" in rounds.description
