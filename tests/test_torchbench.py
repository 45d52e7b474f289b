"""pitstop's own import of torch.utils.benchmark does not log cpp_extension's 'No CUDA runtime' line;
the same import done plainly (as a user script would) still does."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

WARNING = "No CUDA runtime is found"


def _stderr(code: str, tmp_path) -> str:
    env = {**os.environ, "CUDA_HOME": str(tmp_path), "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stderr


@pytest.mark.slow
def test_pitstops_import_is_quiet_and_the_users_is_not(tmp_path):
    plain = _stderr("import torch.utils.benchmark", tmp_path)
    assert WARNING in plain  # the line this module mutes exists on this torch
    quiet = _stderr(
        "import logging\n"
        "from pitstop.torchbench import torch_benchmark\n"
        "assert torch_benchmark().Timer\n"
        "assert logging.getLogger('torch.utils.cpp_extension').level == logging.NOTSET\n",
        tmp_path,
    )
    assert WARNING not in quiet
