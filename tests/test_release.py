"""A release a user can install: ``python -m build`` makes an sdist and a wheel (the wheel built from the
sdist, as build does), the wheel installs into a fresh environment and ``pitstop --version`` runs there.

The fresh venv sees the current interpreter's packages (torch, rich ...) through a .pth file, as a
user's environment would have them; pip runs with --no-index --no-deps, so nothing is downloaded.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import venv
import zipfile
from pathlib import Path

import pytest

import pitstop

ROOT = Path(__file__).resolve().parents[1]
SKIP = (".venv", ".git", "dist", "build", "*.egg-info", "__pycache__", ".pytest_cache", "pitstop-report-*")


def test_version_is_the_projects_in_one_place():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert pitstop.__version__ == project["version"]
    done = subprocess.run(
        [sys.executable, "-m", "pitstop", "--version"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and done.stdout.strip() == f"pitstop {pitstop.__version__}"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_build_makes_sdist_and_wheel_that_install_and_run(tmp_path):
    pytest.importorskip("build")
    src, dist = tmp_path / "src", tmp_path / "dist"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(*SKIP))  # build writes egg-info beside it
    built = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), str(src)],
        capture_output=True,
        text=True,
        timeout=500,
    )
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    version = pitstop.__version__
    (sdist,) = dist.glob(f"pitstop-{version}.tar.gz")
    (wheel,) = dist.glob(f"pitstop-{version}-py3-none-any.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for data in (
        "pitstop/report/schema.json",
        "pitstop/py.typed",
        "pitstop/profile/process/rankhook/sitecustomize.py",
    ):
        assert data in names, data
    assert sdist.stat().st_size > 0

    env_dir = tmp_path / "userenv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    py = env_dir / "bin" / "python"
    site = subprocess.check_output(
        [py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True
    ).strip()
    (Path(site) / "user-packages.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PIP_INDEX_URL", "PIP_FIND_LINKS")}
    pip = [py, "-m", "pip", "install", "--no-index", "--no-deps", "--disable-pip-version-check", "-q"]
    installed = subprocess.run([*pip, str(wheel)], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert installed.returncode == 0, installed.stderr[-3000:]
    where = subprocess.check_output(
        [py, "-c", "import pitstop; print(pitstop.__file__)"], env=env, text=True, cwd=tmp_path
    )
    assert Path(where.strip()).is_relative_to(env_dir)  # the wheel's copy, not the source tree's
    shown = subprocess.run(
        [env_dir / "bin" / "pitstop", "--version"], env=env, capture_output=True, text=True, cwd=tmp_path
    )
    assert shown.returncode == 0 and shown.stdout.strip() == f"pitstop {version}", shown.stderr
