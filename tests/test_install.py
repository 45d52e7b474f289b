"""`pip install .` into a fresh environment that already has the pinned torch keeps that torch.

The fresh venv sees the current interpreter's packages (torch among them) through a .pth file, as a
user's environment would have them installed; pip runs with --no-index, so it cannot download a torch
(or anything) and must take what is there: the install fails if it wanted another torch.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROBE = (
    "import json, torch, pitstop; print(json.dumps([torch.__version__, torch.__file__, pitstop.__file__]))"
)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_pip_install_dot_keeps_the_environments_torch(tmp_path):
    torch = pytest.importorskip("torch")
    env_dir = tmp_path / "userenv"
    venv.EnvBuilder(with_pip=False).create(env_dir)  # pip and setuptools come from the .pth below
    py = env_dir / "bin" / "python"
    site = Path(
        subprocess.check_output(
            [py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True
        ).strip()
    )
    (site / "user-packages.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    env = {
        k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL")
    }
    before = subprocess.check_output(
        [py, "-c", "import torch; print(torch.__version__, torch.__file__)"], env=env, text=True
    )
    assert before.split()[0] == torch.__version__
    r = subprocess.run(
        [
            py,
            "-m",
            "pip",
            "install",
            "--no-index",
            "--no-build-isolation",
            "--disable-pip-version-check",
            "-q",
            str(ROOT),
        ],
        env=env,
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    import json

    version, torch_file, pitstop_file = json.loads(
        subprocess.check_output([py, "-c", PROBE], env=env, text=True, cwd=tmp_path)
    )
    assert f"{version} {torch_file}" == before.strip()  # the same torch, from the same place
    assert Path(pitstop_file).is_relative_to(site) and not Path(pitstop_file).is_relative_to(ROOT)
    # data files the package runs: the report schema, and the per-rank hook torchrun workers import
    installed = Path(pitstop_file).parent
    assert (installed / "report" / "schema.json").is_file()
    assert (installed / "profile" / "process" / "rankhook" / "sitecustomize.py").is_file()
    out = subprocess.run([env_dir / "bin" / "pitstop", "--version"], env=env, capture_output=True, text=True)
    assert out.returncode == 0 and "pitstop" in out.stdout
    assert sys.executable != str(py)
