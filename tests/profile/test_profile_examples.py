"""The built-in examples with planted problems: the top finding names the planted problem, and the
healthy example raises no alarm."""

from __future__ import annotations

import dataclasses
import statistics
import sys
from pathlib import Path

import pytest

from pitstop.findings import Severity
from pitstop.host import cpu
from pitstop.profile.runs.runner import RunSpec, run

pytestmark = pytest.mark.slow
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def line_of(name: str, needle: str) -> int:
    lines = (EXAMPLES / name).read_text().splitlines()
    return next(i for i, text in enumerate(lines, 1) if needle in text)


def profile_example(name: str, *args: str, steps: int = 6):
    spec = RunSpec(
        command=[sys.executable, str(EXAMPLES / name), *args],
        steps=steps,
        warmup=2,
        quiet=True,
        env={"OMP_NUM_THREADS": "1"},
    )
    result = run(spec)
    assert result.ok, result.error
    assert len(result.steps) == steps
    return result.report()


# The wait-based findings' interval comes from blocks of 3 steps: 12 steps give 4 blocks. With 6 (2
# blocks, a t interval on 1 degree of freedom) one slow block leaves the lower bound at 0 and the
# finding unconfirmed, which is right for so short a run but not what these tests are about.
WAIT_STEPS = 12


def test_slow_loader_ranks_dataloader_workers_first():
    report = profile_example("slow_loader.py", "--images", "48", steps=WAIT_STEPS)
    top = report.ranked()[0]
    assert top.id == "dataloader.workers", [(f.id, f.est_saving_s) for f in report.ranked()]
    assert top.severity is Severity.WARN and top.share > 0.3
    assert top.location.endswith(f"slow_loader.py:{line_of('slow_loader.py', 'loader = DataLoader(')}")
    assert "num_workers=" in top.fix_code


def test_item_loop_ranks_sync_item_first():
    report = profile_example("item_sync.py", steps=WAIT_STEPS)
    top = report.ranked()[0]
    assert top.id == "sync.item", [(f.id, f.est_saving_s) for f in report.ranked()]
    assert top.location.endswith(f"item_sync.py:{line_of('item_sync.py', 'bool(preds[i] == y[i])')}")
    assert top.data["syncs_per_step"] == 128
    assert ".tolist()" in top.fix_code


@pytest.mark.skipif(not cpu.cpu_has_fast_bf16(), reason="needs a CPU with AVX512_BF16/AMX")
def test_fp32_conv_net_ranks_a_compute_finding_first():
    report = profile_example("conv_fp32.py")
    ranked = report.ranked()
    assert ranked[0].id == "precision.amp", [(f.id, f.est_saving_s) for f in ranked]
    assert ranked[0].est_saving_s > 0 and ranked[0].data["new_s"] < ranked[0].data["base_s"]
    assert report.by_id("memory_format.channels_last") is not None  # probed either way


def test_healthy_example_raises_no_alarm():
    report = profile_example("healthy.py")
    # healthy; or, where other jobs' load left a probe's interval reaching 5% of the step, undecided
    assert report.by_id("summary.healthy") is not None or report.by_id("summary.unconfirmed") is not None
    alarms = [f.id for f in report.findings if f.severity in (Severity.WARN, Severity.ERROR)]
    assert alarms == []


def test_imagenet_style_script_runs_unmodified():
    """A conventional third-party-style script (argparse, FakeData, torchvision ResNet, worker processes,
    meters calling .item()) is profiled without any change to it."""
    name = "imagenet_style.py"
    spec = RunSpec(
        command=[
            sys.executable,
            str(EXAMPLES / name),
            "--dummy",
            "-a",
            "resnet18",
            "-b",
            "4",
            "--image-size",
            "32",
            "-j",
            "1",
            "--train-images",
            "200",
        ],
        steps=3,
        warmup=1,
        quiet=True,
        probes=False,
        env={"OMP_NUM_THREADS": "1"},
    )
    result = run(spec)
    assert result.ok, result.error
    assert len(result.steps) == 3
    (loader,) = result.config["loaders"]
    assert loader["num_workers"] == 1 and loader["dataset_type"] == "FakeData"
    assert loader["location"].endswith(
        f"{name}:{line_of(name, 'train_loader = torch.utils.data.DataLoader(')}"
    )
    assert result.config["models"][0]["type"] == "ResNet"
    f = result.report().by_id("sync.item")
    assert f is not None and f.location.endswith(f"{name}:{line_of(name, 'losses.update(loss.item()')}")


def test_page_faults_are_counted_per_step_and_probed_on_cpu():
    plain = profile_example("conv_fp32.py")
    hm = plain.sections["probes"]["host_memory"]
    # Before/after the switch on the script's own model: faults per pass fall (to ~0: the heap is reused).
    assert hm["new_faults"] <= hm["base_faults"], hm
    assert plain.by_id("host.page_faults") is not None  # a warning or a pass, by the measured time
    # The override keeps freed memory in the child from the start, so the steps themselves stop faulting.
    from pitstop.profile.record.overrides import Overrides

    spec = RunSpec(
        command=[sys.executable, str(EXAMPLES / "conv_fp32.py")],
        steps=12,
        warmup=2,
        quiet=True,
        env={"OMP_NUM_THREADS": "1"},
        overrides=Overrides(keep_host_memory=True),
    )
    kept = run(spec)
    assert kept.ok, kept.error
    assert kept.config["host_memory"].startswith("glibc keeps"), kept.config
    assert not kept.config["override_errors"]
    base = run(dataclasses.replace(spec, overrides=Overrides(), probes=False))
    per_step = {name: [s.minor_faults for s in r.steps] for name, r in (("base", base), ("kept", kept))}
    # glibc's dynamic mmap threshold makes the plain steps' faults vary (0 to ~4,000 a step): their
    # mean over 12 steps, not a median of a few, is what falls
    assert statistics.fmean(per_step["kept"]) < statistics.fmean(per_step["base"]) / 2, per_step


def test_slow_steps_example_decides_with_intervals_or_says_undecided():
    """examples/resnet_slow_steps.py, made smaller so the test stays short (the full size is ~1 s a step),
    profiled as `pitstop profile` does, fresh-run confirmation included. Whatever this CPU measures (no
    fast bf16: autocast is not probed; a loaded machine: wide intervals), every warning and every
    measured pass carries the interval that decides it, and an undecided probe says what decides it."""
    from pitstop.profile.confirm.fresh_confirm import confirm_all

    spec = RunSpec(
        command=[
            sys.executable,
            str(EXAMPLES / "resnet_slow_steps.py"),
            "--image-size",
            "64",
            "--batch-size",
            "4",
        ],
        steps=6,
        warmup=2,
        quiet=True,
        env={"OMP_NUM_THREADS": "1"},
    )
    result = run(spec)
    assert result.ok, result.error
    confirm_all(spec, result)
    report = result.report()
    step = report.sections["breakdown"]["median_step_s"]
    probes = report.sections.get("probes") or {}
    assert "channels_last" in probes and probes["channels_last"].get("budget_s", 0) >= 6.0
    checked = 0
    for f in report.findings:
        data = f.data if isinstance(f.data, dict) else {}
        if f.severity is Severity.WARN and data.get("confirmed") is not None:
            lo, _ = data["saving_ci_s"]
            assert lo >= 0.05 * step, f
        if f.severity is Severity.PASS and "saving_s" in data:
            assert data["verdict"] == "no gain" and data["saving_ci_s"][1] < 0.05 * step, f
        # undecided: a prediction not confirmed, or a probe that ruled nothing out
        if data.get("verdict") == "undecided":
            assert f.severity is Severity.INFO, f
            assert "not confirmed" in f.evidence or "pitstop fix --candidates" in f.fix, f
        checked += f.id in ("precision.amp", "memory_format.channels_last")
    assert checked >= 1  # channels_last is probed on any CPU (a conv net fed NCHW)
