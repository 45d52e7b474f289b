"""Commands as users type them: console scripts, launchers and shell wrappers after ``--``.

``torchrun``, ``accelerate`` and any other console script whose interpreter is Python are files that
import their entry point and call it, so they run unchanged as Python scripts (``runpy.run_path``). A name
without a slash is looked up on PATH, then in the active virtual environment's ``bin`` (``VIRTUAL_ENV``,
then the one pitstop runs from). A shell script is refused with the Python commands it contains.

Launchers (``torchrun``, ``python -m torch.distributed.run``, ``accelerate launch``) are recognised so the
profile can run the launcher untouched and instrument each worker it starts (``pitstop.profile.runs.ranks``).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

_SHELLS = {"sh", "bash", "zsh", "dash", "ksh", "fish"}
_ENTRY = re.compile(r"^from\s+([\w.]+)\s+import\s+(\w+)", re.M)
# lines of a shell script that start Python work: what to run under pitstop instead
_PY_LINE = re.compile(r"^\s*(?:exec\s+)?\S*(?:python[\d.]*|torchrun|accelerate|deepspeed)\b.*$", re.M)
TORCHRUN_MODULES = {"torch.distributed.run", "torch.distributed.launch"}
ACCELERATE_MODULES = {"accelerate.commands.accelerate_cli", "accelerate.commands.launch"}


_PYTHON = re.compile(r"^python(\d+(\.\d+)?)?$")
# interpreter flags that take no argument / one argument; we run the script with pitstop's interpreter
_PY_FLAGS = {"-u", "-B", "-O", "-OO", "-s", "-E", "-I", "-q", "-b", "-bb"}
_PY_FLAGS_ARG = {"-W", "-X"}


class CommandError(ValueError):
    """The command after ``--`` cannot be run (no script, unsupported form, file not found)."""


@dataclass(frozen=True)
class Executable:
    """A file the command names: its path and, for a Python console script, its ``module:attr`` entry."""

    path: Path
    python: bool
    entry: str | None = None
    shell: bool = False


def find_executable(name: str, cwd: str | None = None) -> Path | None:
    """``name`` as a path (it has a slash, or exists in ``cwd``), else on PATH, else in the venv's bin."""
    here = Path(cwd or ".") / name
    if os.sep in name or here.is_file():
        return here if here.is_file() else None
    found = shutil.which(name)
    if found:
        return Path(found)
    for d in _venv_bins():
        p = d / name
        if p.is_file() and os.access(p, os.X_OK):
            return p
    return None


def _venv_bins() -> list[Path]:
    bins = []
    if os.environ.get("VIRTUAL_ENV"):
        bins.append(Path(os.environ["VIRTUAL_ENV"]) / "bin")
    bins += [Path(sys.prefix) / "bin", Path(sys.executable).parent]
    return list(dict.fromkeys(bins))


def inspect_executable(path: Path) -> Executable:
    """Read the file's interpreter line: Python (with its entry point when it is a console script), a
    shell, or neither."""
    try:
        head = path.read_bytes()[:4096].decode("utf-8", errors="replace")
    except OSError:
        return Executable(path, python=False)
    first = head.splitlines()[0] if head else ""
    interp = first[2:].strip().split() if first.startswith("#!") else []
    names = [os.path.basename(w) for w in interp]
    if names[:1] == ["env"]:
        names = [w for w in names[1:] if not w.startswith("-")]
    prog = names[0] if names else ""
    if re.match(r"^python[\d.]*$", prog) or path.suffix == ".py":
        m = _ENTRY.search(head)
        return Executable(path, python=True, entry=f"{m.group(1)}:{m.group(2)}" if m else None)
    return Executable(path, python=False, shell=prog in _SHELLS or path.suffix == ".sh")


def shell_message(command: list[str], cwd: str | None = None) -> str:
    """What to tell a user who put a shell command after ``--``: run its Python command instead."""
    script = next((a for a in command[1:] if not a.startswith("-")), None)
    if os.path.basename(command[0]) not in _SHELLS:
        script = command[0]
    lines: list[str] = []
    if script:
        p = Path(cwd or ".") / script
        with contextlib.suppress(OSError):
            lines = [m.group(0).strip() for m in _PY_LINE.finditer(p.read_text(errors="replace"))]
    what = f"{script} is a shell script" if script else f"{command[0]} is a shell"
    msg = f"pitstop profiles Python processes and {what}: run the Python command it starts under pitstop"
    if lines:
        shown = "; ".join(f"pitstop profile -- {ln}" for ln in lines[:3])
        return f"{msg}, e.g. {shown}"
    return f"{msg}, e.g. pitstop profile -- python train.py (or -- torchrun ... train.py)"


def launcher_of(kind: str, target: str, args: list[str], entry: str | None = None) -> str | None:
    """ "torchrun" / "accelerate" when the command starts a launcher that runs workers, else None."""
    module = target if kind == "module" else (entry or "").split(":")[0]
    if module in TORCHRUN_MODULES:
        return "torchrun"
    if module == "accelerate.commands.launch" or (
        module == "accelerate.commands.accelerate_cli" and args[:1] == ["launch"]
    ):
        return "accelerate"
    return None


def resolve_script(command: list[str], cwd: str | None = None) -> tuple[Path | None, str | None]:
    """The Python file to run for a command that does not start with ``python``: (path, None), or
    (None, a message for the user)."""
    name = command[0]
    if os.path.basename(name) in _SHELLS:
        return None, shell_message(command, cwd)
    path = find_executable(name, cwd)
    if path is None:
        hint = (
            ""
            if name.endswith(".py")
            else " (not a file, and not on PATH or in the virtual environment's bin)"
        )
        return None, f"script not found: {name}{hint}"
    exe = inspect_executable(path)
    if exe.python:
        return path, None
    if exe.shell:
        return None, shell_message(command, cwd)
    return None, f"{name} ({path}) is not a Python program: pitstop profiles Python training scripts"


def launcher_for(kind: str, target: str, args: list[str]) -> str | None:
    """``launcher_of`` for a parsed command, reading a console script's entry point from its file; "srun"
    for the script of one task of a Slurm job step of several tasks, one rank per task."""
    entry = inspect_executable(Path(target)).entry if kind == "script" else None
    launcher = launcher_of(kind, target, args, entry)
    if launcher is None and slurm_task():
        return "srun"
    return launcher


def slurm_task(env: dict[str, str] | None = None) -> bool:
    """This process is one task of a Slurm job step of several tasks (``srun`` of one task per rank), not
    started by a launcher of its own (torchrun inside srun sets RANK for its workers)."""
    env = dict(os.environ) if env is None else env
    return "SLURM_PROCID" in env and int(env.get("SLURM_NTASKS", "1") or 1) > 1 and "RANK" not in env


def parse_command(command: list[str], cwd: str | None = None) -> tuple[str, str, list[str]]:
    """``["python", "train.py", ...]`` / ``["python", "-m", "pkg.mod", ...]`` / ``["train.py", ...]``
    -> (kind "script"|"module", target, args). Raises CommandError with a message for the user."""
    if not command:
        raise CommandError("no command: put the training command after '--', e.g. -- python train.py")
    rest = list(command)
    if _PYTHON.match(os.path.basename(rest[0])):
        rest = rest[1:]
        while rest and rest[0].startswith("-") and rest[0] != "-m":
            flag = rest.pop(0)
            if flag in _PY_FLAGS_ARG:
                if not rest:
                    raise CommandError(f"python flag {flag} needs a value")
                rest.pop(0)
            elif flag == "-c":
                raise CommandError("python -c is not supported: put the code in a file")
            elif flag not in _PY_FLAGS and not flag.startswith(("-W", "-X")):
                raise CommandError(f"unsupported python flag {flag!r}")
        if not rest:
            raise CommandError("no script after python")
        if rest[0] == "-m":
            if len(rest) < 2:
                raise CommandError("python -m needs a module name")
            return "module", rest[1], rest[2:]
    script = rest[0]
    path = Path(cwd or ".") / script
    if not path.is_file() and len(rest) < len(command):
        raise CommandError(f"script not found: {script}")
    if len(rest) == len(command):  # no python in front: a console script (torchrun, ...), a shell command
        found, message = resolve_script(rest, cwd)
        if found is None:
            raise CommandError(message or f"script not found: {script}")
        path = found
    return "script", str(path.resolve()), rest[1:]
