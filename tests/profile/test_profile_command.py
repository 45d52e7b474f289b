"""Commands as users type them: console scripts on PATH or in the venv, launchers, shell wrappers."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import pytest

from pitstop.profile.process.command import inspect_executable, launcher_of, resolve_script
from pitstop.profile.runs.runner import CommandError, RunSpec, parse_command, run

CONSOLE = """#!{python}
import sys
from {module} import {attr}
if __name__ == '__main__':
    sys.argv[0] = sys.argv[0].removesuffix('.exe')
    sys.exit({attr}())
"""


def console_script(d: Path, name: str, module: str, attr: str = "main") -> Path:
    d.mkdir(parents=True, exist_ok=True)
    p = d / name
    p.write_text(CONSOLE.format(python=sys.executable, module=module, attr=attr))
    p.chmod(0o755)
    return p


def test_console_script_on_path_resolves_to_its_file_and_entry(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    p = console_script(bin_dir, "mytrain", "mypkg.cli")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    kind, target, args = parse_command(["mytrain", "--lr", "0.1"], cwd=str(tmp_path / "elsewhere"))
    assert (kind, Path(target), args) == ("script", p.resolve(), ["--lr", "0.1"])
    assert inspect_executable(p).entry == "mypkg.cli:main"


def test_console_script_found_in_the_venv_bin_when_not_on_path(tmp_path, monkeypatch):
    venv = tmp_path / "venv"
    p = console_script(venv / "bin", "torchrun", "torch.distributed.run")
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setenv("VIRTUAL_ENV", str(venv))
    kind, target, args = parse_command(["torchrun", "--nproc_per_node=2", "train.py"])
    assert Path(target) == p.resolve()
    exe = inspect_executable(Path(target))
    assert launcher_of(kind, target, args, exe.entry) == "torchrun"


def test_launchers_recognised_and_other_commands_not():
    assert launcher_of("module", "torch.distributed.run", ["train.py"]) == "torchrun"
    assert (
        launcher_of("script", "/x/accelerate", ["launch", "t.py"], "accelerate.commands.accelerate_cli:main")
        == "accelerate"
    )
    assert launcher_of("script", "/x/accelerate", ["env"], "accelerate.commands.accelerate_cli:main") is None
    assert launcher_of("script", "/x/train.py", [], None) is None


def test_env_shebang_python_is_python(tmp_path):
    p = tmp_path / "tool"
    p.write_text("#!/usr/bin/env -S python3 -u\nprint(1)\n")
    assert inspect_executable(p).python


def test_shell_script_gets_a_message_naming_its_python_command(tmp_path):
    (tmp_path / "run.sh").write_text(
        "#!/bin/bash\nset -e\nexport X=1\ntorchrun --nproc_per_node=2 train.py --bs 8\n"
    )
    with pytest.raises(CommandError) as e:
        parse_command(["bash", "run.sh"], cwd=str(tmp_path))
    assert "pitstop profile -- torchrun --nproc_per_node=2 train.py --bs 8" in str(e.value)
    path, message = resolve_script(["./run.sh"], cwd=str(tmp_path))
    assert path is None and "shell script" in (message or "")


def test_native_program_is_refused(tmp_path):
    native = tmp_path / "tool"
    native.write_bytes(b"\x7fELF\x02\x01\x01" + bytes(64))
    native.chmod(0o755)
    with pytest.raises(CommandError, match="not a Python program"):
        parse_command([str(native)])
    with pytest.raises(CommandError, match="not on PATH"):
        parse_command(["no-such-tool-xyz"], cwd=str(tmp_path))


@pytest.mark.slow
def test_console_script_runs_under_profile(tmp_path, monkeypatch):
    pkg = tmp_path / "lib" / "tinytrain"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "cli.py").write_text(
        textwrap.dedent(
            """
            import torch
            from torch import nn
            def main():
                torch.set_num_threads(1)
                model = nn.Linear(4, 2)
                opt = torch.optim.SGD(model.parameters(), lr=0.1)
                for _ in range(20):
                    loss = model(torch.randn(8, 4)).sum()
                    opt.zero_grad(); loss.backward(); opt.step()
                return 0
            """
        )
    )
    bin_dir = tmp_path / "bin"
    console_script(bin_dir, "tinytrain", "tinytrain.cli")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    res = run(
        RunSpec(
            command=["tinytrain"],
            steps=3,
            warmup=1,
            quiet=True,
            probes=False,
            env={"PYTHONPATH": str(tmp_path / "lib")},
        )
    )
    assert res.status == "stopped", res.error
    assert len(res.steps) == 3
