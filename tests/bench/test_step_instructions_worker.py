"""benchmarks/profile_step_instructions.py's workers run natively (callgrind's client requests do nothing
outside valgrind): each configuration must reach the end of its counted steps, so an API it calls that
changed fails here, not as a silent zero count in a results file."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "profile_step_instructions.py"


def _module():
    spec = importlib.util.spec_from_file_location("profile_step_instructions", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("config", ["plain", "instruments", "rank"])
def test_each_configuration_runs_its_counted_steps(config, tmp_path):
    mod = _module()
    if (
        not (shutil.which("cc") or shutil.which("gcc"))
        or not Path("/usr/include/valgrind/callgrind.h").exists()
    ):
        pytest.skip("no C compiler or valgrind headers for the callgrind helper")
    helper = mod.build_helper(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    p = subprocess.run(
        [sys.executable, str(SCRIPT), "--worker", config, "tiny", str(helper)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr[-3000:]
