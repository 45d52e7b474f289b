"""pitstop.Profiler: in-process profiling of a training function, the same report as the CLI."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

import pitstop
from pitstop.findings import Report
from pitstop.integrations.profiler import Profiler

torch.set_num_threads(1)


def make_model(seed: int = 0, adam: bool = False) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 2))
    if adam:
        return model, torch.optim.Adam(model.parameters(), lr=0.01)
    return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def train(model, opt, loader, max_steps: int, done: list[int] | None = None) -> int:
    n = 0
    for x, y in loader:
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        n += 1
        if done is not None:
            done.append(n)
        if n >= max_steps:
            break
    return n


def test_notebook_style_block_gets_the_top_finding_and_keeps_training(
    unpatched, slow_dataset, patched_now, line_of
):
    model, opt = make_model()
    loader = DataLoader(slow_dataset(), batch_size=4)
    with pitstop.Profiler(steps=6, warmup=2, probes=False) as prof:
        ran = train(model, opt, loader, max_steps=14)
    assert ran == 14  # training went on after the measured steps
    report = prof.report()
    assert isinstance(report, Report) and report.tool == "profile"
    assert report.meta["measured_steps"] == 6 and report.meta["warmup_steps"] == 2
    assert report.meta["status"] == "completed"
    top = prof.ranked()[0]
    assert top.id == "dataloader.workers"
    # built before the block: located where it is iterated
    assert top.location == f"tests/integrations/test_profiler.py:{line_of('for x, y in loader:')}"
    assert len(report.sections["steps"]) == 8  # nothing recorded after measuring stopped
    assert patched_now() == unpatched


def test_patches_are_gone_right_after_the_measured_steps(unpatched, slow_dataset, patched_now):
    model, opt = make_model()
    loader = DataLoader(slow_dataset(delay_s=0.0), batch_size=4)
    seen: list[dict] = []
    with Profiler(steps=3, warmup=1, probes=False):
        done: list[int] = []
        for x, y in loader:
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            done.append(1)
            now = patched_now()
            # hooks stay registered as no-ops until the block ends (torch may be iterating them)
            seen.append(all(now[k] == v for k, v in unpatched.items() if not k.endswith("hooks")))
            if len(done) == 8:
                break
    # step 4 (the last measured) closes when the 5th starts: from then on nothing is patched
    assert seen == [False] * 4 + [True] * 4


def test_stop_true_ends_the_block_and_the_report_says_stopped(unpatched, slow_dataset, patched_now, line_of):
    model, opt = make_model()
    loader = DataLoader(slow_dataset(delay_s=0.0), batch_size=4)
    done: list[int] = []
    after_block = False
    with Profiler(steps=3, warmup=1, stop=True, probes=False) as prof:
        loader = DataLoader(slow_dataset(delay_s=0.0), batch_size=4)  # BUILT-INSIDE
        train(model, opt, loader, max_steps=50, done=done)
    after_block = True
    assert after_block and len(done) < 50
    assert prof.report().meta["status"] == "stopped"
    assert prof.report().meta["measured_steps"] == 3
    assert issubclass(pitstop.StopProfiling, BaseException)
    (ld,) = prof.report().sections["loaders"]
    assert ld["location"] == f"tests/integrations/test_profiler.py:{line_of('# BUILT-INSIDE')}"


def test_decorator_form_returns_the_value_and_keeps_the_report(unpatched, slow_dataset, patched_now):
    model, opt = make_model()
    loader = DataLoader(slow_dataset(delay_s=0.0), batch_size=4)

    @Profiler(steps=3, warmup=1, probes=False)
    def fit() -> int:
        return train(model, opt, loader, max_steps=10)

    assert fit() == 10
    report = fit.profiler.report()
    assert report.meta["measured_steps"] == 3
    assert report.meta["command"].endswith("fit")
    assert fit() == 10  # a second call profiles afresh, the loader built outside seen again
    assert fit.profiler.report() is not report
    assert fit.profiler.report().sections["loaders"][0]["batches_seen"] >= 4
    assert not hasattr(loader, "_pitstop_captured")


def test_an_error_in_the_block_propagates_and_still_reports(unpatched, slow_dataset, patched_now):
    model, opt = make_model()
    loader = DataLoader(slow_dataset(delay_s=0.0), batch_size=4)
    prof = Profiler(steps=20, warmup=1, probes=False)
    with pytest.raises(ValueError, match="boom"), prof:
        train(model, opt, loader, max_steps=4)
        raise ValueError("boom")
    report = prof.report()
    assert report.meta["status"] == "error" and "ValueError: boom" in report.error
    assert report.meta["measured_steps"] == 3


def test_one_profiler_at_a_time(unpatched, slow_dataset, patched_now):
    with Profiler(probes=False), pytest.raises(RuntimeError, match="already measuring"):
        Profiler(probes=False).start()


def test_outputs_json_html_and_jupyter_escape_user_strings(tmp_path, unpatched, slow_dataset):
    model, opt = make_model()
    loader = DataLoader(slow_dataset(delay_s=0.0), batch_size=4)
    hostile = "<script>alert(1)</script>"
    with Profiler(steps=3, warmup=1, probes=False, label=hostile) as prof:
        train(model, opt, loader, max_steps=6)
    doc = json.loads(prof.to_json(tmp_path / "r.json"))
    assert doc["tool"] == "profile" and doc["meta"]["command"] == hostile
    assert json.loads((tmp_path / "r.json").read_text()) == doc
    page = prof.to_html(tmp_path / "r.html").read_text()
    assert hostile not in page and "&lt;script&gt;" in page
    frame = prof._repr_html_()
    assert frame.startswith("<iframe sandbox") and "<script>" not in frame


@pytest.mark.slow
@pytest.mark.parametrize("adam", [False, True])
def test_probes_run_on_exit_and_leave_the_training_state_as_it_was(
    unpatched, slow_dataset, patched_now, adam
):
    """Same seeds with and without the profiler (probes on): same weights, buffers, optimizer state."""
    loader_a = DataLoader(slow_dataset(delay_s=0.0), batch_size=8)
    loader_b = DataLoader(slow_dataset(delay_s=0.0), batch_size=8)
    model_a, opt_a = make_model(1, adam=adam)
    model_b, opt_b = make_model(1, adam=adam)
    with Profiler(steps=4, warmup=1) as prof:
        train(model_a, opt_a, loader_a, max_steps=8)
    train(model_b, opt_b, loader_b, max_steps=8)
    assert "probes" in prof.report().sections
    for (ka, va), (kb, vb) in zip(model_a.state_dict().items(), model_b.state_dict().items(), strict=True):
        assert ka == kb and torch.equal(va, vb), ka
    state_a, state_b = copy.deepcopy(opt_a.state_dict()), copy.deepcopy(opt_b.state_dict())
    for sa, sb in zip(state_a["state"].values(), state_b["state"].values(), strict=True):
        assert sa.keys() == sb.keys()
        for k in sa:
            assert torch.equal(torch.as_tensor(sa[k]), torch.as_tensor(sb[k])), k
    for pa, pb in zip(model_a.parameters(), model_b.parameters(), strict=True):
        assert torch.equal(pa.grad, pb.grad)
    assert model_a.training and model_a[1].training


def test_metrics_carry_the_breakdown_and_mfu_when_the_report_has_it():
    from pitstop.integrations.window import metrics_of

    bd = {"steps": 4, "mean_step_s": 0.02, "median_step_s": 0.018, "data_wait_s": 0.01, "forward_s": 0.004}
    report = Report(tool="profile", sections={"breakdown": bd}, meta={"steps_per_s": 55.5})
    m = metrics_of(report)
    assert m["pitstop/step_ms"] == pytest.approx(18.0) and m["pitstop/data_wait_ms"] == pytest.approx(10.0)
    assert m["pitstop/optimizer_ms"] == 0.0 and m["pitstop/steps_per_s"] == 55.5 and "pitstop/mfu" not in m
    report.sections["mfu"] = {"mfu": 0.31, "peak_flops": 1e12}
    assert metrics_of(report)["pitstop/mfu"] == 0.31
    assert metrics_of(Report(tool="profile")) == {}


@pytest.mark.slow
def test_notebook_style_example_ranks_the_planted_loader_first(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    example = Path(__file__).resolve().parents[2] / "examples" / "notebook_style.py"
    out = tmp_path / "r.json"
    r = subprocess.run(
        [sys.executable, str(example), "--images", "48", "--steps", "16", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    assert doc["findings"][0]["id"] == "dataloader.workers"
    assert doc["findings"][0]["location"].endswith("notebook_style.py:" + str(_loop_line(example)))
    assert "trained 16 steps; measured 12" in r.stdout


def _loop_line(path) -> int:
    return next(i for i, t in enumerate(path.read_text().splitlines(), 1) if "for x, y in loader:" in t)


def test_persistent_workers_keep_serving_after_the_block(unpatched, slow_dataset):
    model, opt = make_model()
    loader = DataLoader(slow_dataset(n=32, delay_s=0.0), batch_size=4, num_workers=1, persistent_workers=True)
    with Profiler(steps=3, warmup=1, probes=False) as prof:
        first = train(model, opt, loader, max_steps=100)
    assert prof.report().meta["measured_steps"] == 3
    assert train(model, opt, loader, max_steps=100) == first == 8  # the same worker pool, still alive


@pytest.mark.slow
def test_inside_a_pitstop_profile_run_the_cli_measures_and_the_profiler_steps_aside(tmp_path):
    import sys

    from pitstop.profile.runs.runner import RunSpec, run

    script = tmp_path / "train.py"
    script.write_text(
        "import json, sys, torch\n"
        "import pitstop\n"
        "model = torch.nn.Linear(4, 2)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "with pitstop.Profiler(steps=3, warmup=1, probes=False) as prof:\n"
        "    for i in range(50):\n"
        "        model(torch.randn(8, 4)).sum().backward()\n"
        "        opt.step()\n"
        f"    open({str(tmp_path / 'inner.json')!r}, 'w').write('not reached')\n"
    )
    result = run(RunSpec(command=[sys.executable, str(script)], steps=4, warmup=1, probes=False, quiet=True))
    assert result.status == "stopped" and len(result.steps) == 4  # the CLI's stop went through the block
    assert not (tmp_path / "inner.json").exists()


def test_nested_profiler_installs_nothing_and_lets_the_outer_stop_through(
    monkeypatch, unpatched, patched_now
):
    from pitstop.integrations import profiler as mod

    monkeypatch.setattr(mod, "_under_pitstop_profile", lambda: True)
    with pytest.raises(pitstop.StopProfiling), Profiler(probes=False) as prof:
        assert patched_now() == unpatched
        raise pitstop.StopProfiling("the enclosing run's stop")
    assert prof.nested and "pitstop profile" in prof.report().error


def test_pitstop_imports_without_the_frameworks_and_says_what_is_missing():
    import subprocess
    import sys

    code = (
        "import sys\n"
        "for m in ('lightning', 'pytorch_lightning', 'transformers'): sys.modules[m] = None\n"
        "import pitstop, pitstop.integrations\n"
        "assert 'torch' not in sys.modules, 'import pitstop pulled in torch'\n"
        "assert pitstop.Profiler is pitstop.integrations.Profiler\n"
        "for name, pkg in (('lightning', 'lightning'), ('transformers', 'transformers')):\n"
        "    try:\n"
        "        __import__(f'pitstop.integrations.{name}')\n"
        "    except ImportError as e:\n"
        "        assert f'pip install {pkg}' in str(e), e\n"
        "    else:\n"
        "        raise AssertionError(name)\n"
        "print('ok')\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
