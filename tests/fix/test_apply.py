"""fix --apply: one patch per kind of fix, placed with ast on small scripts, and the verification run
(fake runner). The patched scripts must still parse and keep every other line byte for byte."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pitstop.fix.apply import apply_all, plan
from pitstop.fix.apply_verify import verify
from pitstop.fix.core import FixConfig, FixResult
from pitstop.fix.judge import Measured
from pitstop.measure import Interval
from pitstop.profile.record.timeline import StepRecord
from pitstop.profile.runs.runner import RunResult

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "mnist_style.py"


def line_of(text: str, needle: str) -> int:
    return next(i + 1 for i, ln in enumerate(text.splitlines()) if needle in ln)


def result_for(script: Path, *fixes: tuple[str, dict]) -> FixResult:
    text = script.read_text()
    config = {
        "loaders": [
            {"location": f"{script}:{line_of(text, 'train_loader = DataLoader(')}", "batches_seen": 3}
        ],
        "models": [{"first_location": f"{script}:{line_of(text, 'output = model(data)')}"}],
        "optimizers": [{"type": "Adadelta", "location": f"{script}:{line_of(text, 'optim.Adadelta(')}"}],
        "device": "cpu",
    }
    r = FixResult(command=[sys.executable, str(script)], baseline=Measured("baseline", "baseline", {}))
    r.config = config
    for kind, ov in fixes:
        r.candidates.append(Measured(kind, kind, ov))
        r.chosen.append(kind)
    return r


@pytest.fixture
def script(tmp_path: Path) -> Path:
    p = tmp_path / "main.py"
    shutil.copy(EXAMPLE, p)
    return p


def only_patch(result: FixResult) -> tuple[str, str]:
    p = plan(result)
    assert not p.unplaced, p.unplaced
    (patch,) = p.patches
    ast.parse(patch.patched)
    return patch.original, patch.patched


def added(original: str, patched: str) -> list[str]:
    before = original.splitlines()
    return [ln for ln in patched.splitlines() if ln not in before]


def test_dataloader_keywords(script):
    orig, new = only_patch(
        result_for(script, ("workers", {"dataloader": {"num_workers": 2, "persistent_workers": True}}))
    )
    (line,) = added(orig, new)
    assert (
        line.strip()
        == "made_up(args.samples, 0), batch_size=args.batch_size, shuffle=True, num_workers=2, persistent_workers=True"
    )


def test_keep_host_memory_is_one_line_at_the_top_of_main_and_its_import(script):
    orig, new = only_patch(result_for(script, ("host_memory", {"keep_host_memory": True})))
    assert added(orig, new) == ["from pitstop.train import keep_host_memory", "    keep_host_memory()"]
    lines = new.splitlines()
    at = lines.index("    keep_host_memory()")
    assert lines[at - 1] == "def main():"
    assert lines.index("from pitstop.train import keep_host_memory") < lines.index("def main():")


def test_channels_last_converts_the_model_line_and_the_input_to_line(script):
    orig, new = only_patch(result_for(script, ("channels_last", {"channels_last": True})))
    lines = new.splitlines()
    m = lines.index("    model = model.to(memory_format=torch.channels_last)")
    assert lines[m - 1] == "    model = Net().to(device)"
    x = lines.index("        data = data.to(memory_format=torch.channels_last)")
    assert lines[x - 1] == "        data, target = data.to(device), target.to(device)"
    assert len(added(orig, new)) == 2


def test_autocast_wraps_forward_and_loss_but_not_backward(script):
    _, new = only_patch(result_for(script, ("amp", {"autocast": "bfloat16"})))
    lines = new.splitlines()
    w = lines.index("        with torch.autocast('cpu', dtype=torch.bfloat16):")
    assert lines[w + 1 : w + 4] == [
        "            output = model(data)",
        "            loss = F.nll_loss(output, target)",
        "        loss.backward()",
    ]
    # the test loop's forward is not touched
    assert (
        new.count("output = model(data)") == 2
        and "            output = model(data)\n            test_loss" in new
    )


def test_float32_converts_the_model_and_the_batch(script):
    orig, new = only_patch(result_for(script, ("float32", {"float32": True})))
    lines = new.splitlines()
    assert lines[lines.index("    model = model.float()") - 1] == "    model = Net().to(device)"
    x = lines.index("        data = data.float()")
    assert lines[x - 1] == "        data, target = data.to(device), target.to(device)"
    assert len(added(orig, new)) == 2


def float64_result(tmp_path: Path) -> FixResult:
    p = tmp_path / "f64.py"
    shutil.copy(EXAMPLE.with_name("float64_model.py"), p)
    text = p.read_text()
    r = FixResult(command=[sys.executable, str(p)], baseline=Measured("baseline", "baseline", {}))
    r.config = {"models": [{"first_location": f"{p}:{line_of(text, 'loss_fn(model(')}"}], "device": "cpu"}
    r.candidates.append(Measured("float32", "float32", {"float32": True}))
    r.chosen.append("float32")
    return r


def test_float32_converts_an_indexed_dataset_once_not_each_batch(tmp_path):
    orig, new = only_patch(float64_result(tmp_path))
    lines = new.splitlines()
    assert lines[lines.index("    x_all = x_all.float()") - 1].startswith("    x_all = torch.from_numpy(")
    assert lines[lines.index("    model = model.float()") - 1] == "    ).double()"
    assert len(added(orig, new)) == 2


@pytest.mark.slow
def test_the_float32_patched_example_still_trains(tmp_path):
    """float32 model and data, float64 targets: the loss promotes, and the script runs to its end."""
    r = float64_result(tmp_path)
    patches = plan(r).patches
    apply_all(patches)
    out = subprocess.run(
        [sys.executable, str(patches[0].path), "--steps", "3"], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]


def test_foreach_on_the_optimizer_constructor(script):
    orig, new = only_patch(result_for(script, ("foreach", {"optimizer_impl": "foreach"})))
    assert [ln.strip() for ln in added(orig, new)] == [
        "optimizer = optim.Adadelta(model.parameters(), lr=args.lr, foreach=True)"
    ]


def test_compile_after_the_model_line(script):
    orig, new = only_patch(result_for(script, ("compile", {"compile": True})))
    assert added(orig, new) == ["    model.compile()"]


def test_cudnn_benchmark_at_the_top_of_main(script):
    orig, new = only_patch(result_for(script, ("cudnn_benchmark", {"cudnn_benchmark": True})))
    assert added(orig, new) == ["    torch.backends.cudnn.benchmark = True"]


def test_every_kind_at_once_is_one_diff_that_parses(script):
    r = result_for(
        script,
        ("workers", {"dataloader": {"num_workers": 2}}),
        ("host_memory", {"keep_host_memory": True}),
        ("channels_last", {"channels_last": True}),
        ("amp", {"autocast": "bfloat16"}),
        ("foreach", {"optimizer_impl": "foreach"}),
    )
    p = plan(r)
    assert not p.unplaced and len(p.patches) == 1
    patch = p.patches[0]
    assert patch.diff.startswith("--- a/") and "+    keep_host_memory()" in patch.diff
    assert set(patch.changes) == {"dataloader", "keep_host_memory", "channels_last", "autocast", "optimizer"}
    ast.parse(patch.patched)
    backups = apply_all(p.patches)
    assert backups[0].read_text() == patch.original and script.read_text() == patch.patched


def test_a_fix_without_a_place_is_reported_not_guessed(tmp_path):
    p = tmp_path / "main.py"
    p.write_text("import torch\nm = torch.nn.Linear(2, 2)\nprint(m(torch.ones(1, 2)))\n")
    r = FixResult(command=[sys.executable, str(p)], baseline=Measured("b", "baseline", {}))
    r.config = {"models": [{"first_location": f"{p}:3"}], "device": "cpu"}
    r.candidates, r.chosen = (
        [Measured("amp", "amp", {"autocast": "bfloat16"}), Measured("compile", "compile", {})],
        ["amp", "compile"],
    )
    out = plan(r)
    # print(m(...)) is wrapped in autocast; no "m = ..." line before the forward? there is: compile placed
    assert not out.unplaced
    r.config = {"models": [{"first_location": f"{p}:9"}], "device": "cpu"}
    out = plan(r)
    assert len(out.unplaced) == 2 and not out.patches


def test_verify_compares_one_run_of_the_patched_script_with_the_interval(script):
    r = result_for(script, ("foreach", {"optimizer_impl": "foreach"}))
    r.baseline.arm.rounds = [[0.12] * 10, [0.12] * 10]
    r.interval = Interval(1.2, 1.1, 1.3, 3, 60, 60)

    def runner(spec):
        steps = [StepRecord(index=i, start_s=0.0, total_s=0.1) for i in range(8)]
        return RunResult(0, None, steps, [1.0] * 8, {}, None, 1.0, status="stopped")

    v = verify(r, FixConfig(), runner)
    assert v.speedup == pytest.approx(1.2) and v.inside is True and "inside" in v.text

    def spiky(spec):  # the median step is 0.1 s as above, but one step of eight takes 0.5 s
        times = [0.1] * 7 + [0.5]
        steps = [StepRecord(index=i, start_s=0.0, total_s=t) for i, t in enumerate(times)]
        return RunResult(0, None, steps, [1.0] * 8, {}, None, 1.0, status="stopped")

    v = verify(r, FixConfig(), spiky)  # throughput: 8 steps in 1.2 s against 1/0.12 steps/s
    assert v.speedup == pytest.approx((8 / 1.2) * 0.12) and v.inside is False and "outside" in v.text

    def broken(spec):
        return RunResult(1, "SyntaxError: boom", [], [], {}, None, 1.0, status="error")

    v = verify(r, FixConfig(), broken)
    assert v.error and "did not run" in v.text


KINDS = [
    ("workers", {"dataloader": {"num_workers": 2}}, "num_workers=2"),
    ("host_memory", {"keep_host_memory": True}, "keep_host_memory()"),
    ("channels_last", {"channels_last": True}, "channels_last"),
    ("amp", {"autocast": "bfloat16"}, "autocast"),
    ("foreach", {"optimizer_impl": "foreach"}, "foreach=True"),
    ("compile", {"compile": True}, ".compile()"),
    ("cudnn_benchmark", {"cudnn_benchmark": True}, "cudnn.benchmark = True"),
    ("float32", {"float32": True}, "model = model.float()"),
]


@pytest.mark.parametrize(("kind", "ov", "marker"), KINDS, ids=[k[0] for k in KINDS])
def test_each_kind_patches_then_verifies_on_the_patched_file(script, kind, ov, marker):
    """Apply one kind, then verify: the re-run sees the patched file on disk (it parses and carries the
    change), and its speed is compared with the interval fix measured."""
    r = result_for(script, (kind, ov))
    r.baseline.arm.rounds = [[0.12] * 10] * 3
    r.interval = Interval(1.2, 1.1, 1.3, 3, 30, 30)
    p = plan(r)
    assert not p.unplaced and len(p.patches) == 1
    backup = apply_all(p.patches)[0]
    assert backup.read_text() == p.patches[0].original and marker not in backup.read_text()
    seen = []

    def runner(spec):
        text = Path(spec.command[-1]).read_text()
        ast.parse(text)
        seen.append((marker in text, spec.overrides.is_empty()))  # the patch does it, not pitstop
        steps = [StepRecord(index=i, start_s=0.0, total_s=0.1) for i in range(8)]
        return RunResult(0, None, steps, [1.0] * 8, {}, None, 1.0, status="stopped")

    v = verify(r, FixConfig(), runner)
    assert seen == [(True, True)] and v.inside is True and "inside" in v.text
    r.interval = Interval(1.5, 1.4, 1.6, 3, 30, 30)  # a re-run slower than the measured interval says so
    assert verify(r, FixConfig(), runner).inside is False


@pytest.mark.slow
def test_the_patched_example_still_trains(script):
    r = result_for(
        script,
        ("workers", {"dataloader": {"num_workers": 2}}),
        ("cudnn_benchmark", {"cudnn_benchmark": True}),
        ("host_memory", {"keep_host_memory": True}),
        ("channels_last", {"channels_last": True}),
        ("amp", {"autocast": "bfloat16"}),
        ("foreach", {"optimizer_impl": "foreach"}),
    )
    apply_all(plan(r).patches)
    out = subprocess.run(
        [sys.executable, str(script), "--samples", "128", "--batch-size", "32"],
        capture_output=True,
        text=True,
        timeout=300,
        env={"PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src"), "PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 0, out.stderr
    assert "Test set: Average loss" in out.stdout
