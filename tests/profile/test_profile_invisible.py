"""The script runs under pitstop exactly as without it: same objects (pickle, deepcopy, save, compile,
script, export, worker processes, signatures), same output, same files, same exit code."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pitstop.profile.runs.runner import RunSpec, run

pytestmark = pytest.mark.slow
SCRIPTS = Path(__file__).resolve().parent / "scripts"
ENV = {"OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}


def _plain(script: Path, args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    import os

    return subprocess.run(
        [sys.executable, str(script), *args],
        cwd=cwd,
        env={**os.environ, **ENV},
        capture_output=True,
        text=True,
        timeout=600,
    )


def _profiled(script: Path, args: list[str], cwd: Path, out: Path):
    spec = RunSpec(
        command=[sys.executable, str(script), *args],
        full=True,
        warmup=1,
        steps=3,
        quiet=True,
        probes=False,
        cwd=str(cwd),
        env=ENV,
    )
    result = run(spec, out_dir=out)
    return result, (out / "stdout.txt").read_text(), (out / "stderr.txt").read_text()


def _files(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("args", [[], ["--calls-only"]], ids=["global-hooks", "class-call"])
def test_models_optimizers_loaders_and_compilers_see_no_pitstop(tmp_path, args):
    script = SCRIPTS / "invisible.py"
    (tmp_path / "plain").mkdir()
    (tmp_path / "profiled").mkdir()
    plain = _plain(script, args, tmp_path / "plain")
    assert plain.returncode == 0, plain.stderr
    result, out, err = _profiled(script, args, tmp_path / "profiled", tmp_path / "run")
    assert result.status == "completed", result.error
    assert out.splitlines() == plain.stdout.splitlines()
    assert err == plain.stderr
    # the run was measured: the model's forward passes and optimizer steps were seen
    assert result.data["step_boundary"] == "optimizer.step()"
    assert len(result.warmup_steps) + len(result.steps) >= 7
    assert result.config["models"][0]["type"] == "Net"
    lines = dict(line.split(": ", 1) for line in out.splitlines())
    assert lines["dynamo_graphs"] == "[1, 0]" and lines["compiled_graph_breaks"] == "{}"


@pytest.mark.parametrize("code", [0, 3])
def test_full_run_prints_writes_and_exits_as_without_pitstop(tmp_path, code):
    script = SCRIPTS / "faithful.py"
    plain_dir, prof_dir = tmp_path / "plain", tmp_path / "profiled"
    plain_dir.mkdir()
    prof_dir.mkdir()
    plain = _plain(script, [str(code)], plain_dir)
    result, out, err = _profiled(script, [str(code)], prof_dir, tmp_path / "run")
    assert plain.returncode == code
    assert result.returncode == code, result.error
    assert out == plain.stdout
    assert err == plain.stderr
    assert _files(prof_dir) == _files(plain_dir)
    assert "atexit.txt" in _files(plain_dir)
    assert len(result.warmup_steps) + len(result.steps) == 24  # every step of the run was measured
