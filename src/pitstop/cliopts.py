"""A command's options as a dataclass, and the argparse arguments built from it.

Each field is one option: ``--field-name`` (underscores become dashes) unless ``flags`` names them,
its type from the annotation (``bool`` is a switch, ``X | None`` an optional X, ``Sequence[str]`` a
repeatable option), its default from the field (none: the option is required). ``remainder`` takes everything after ``--``.

    @dataclass
    class DoctorOptions:
        data: str = opt(".", "training data path to check", metavar="PATH")
        no_write: bool = opt(False, "never write the temporary read-test file")

    add_options(parser, DoctorOptions)       # in register()
    o = options_from(DoctorOptions, args)    # in the handler

An option that names something the command writes (``opt(output="file")`` or ``"dir"``, or
``mark_output`` for a plain argparse option) is checked before the command runs: ``check_outputs``
says why one cannot be written, and ``pitstop.cli`` exits 2 with that line before anything is measured.
"""

from __future__ import annotations

import argparse
import collections.abc
import contextlib
import dataclasses
import os
import tempfile
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")
OUTPUT = "_output:"  # namespace key prefix: (kind, flag) of an option that names an output path


def opt(
    default: Any = dataclasses.MISSING,
    help: str | None = None,
    *,
    flags: tuple[str, ...] = (),
    metavar: str | None = None,
    choices: tuple[Any, ...] | None = None,
    group: str | None = None,
    remainder: bool = False,
    nargs: str | None = None,
    const: Any = None,
    output: str | None = None,
) -> Any:
    """A dataclass field that is also a command-line option (``nargs="?"`` with ``const``: the value
    given, ``const`` for the bare flag, the default without it). ``output``: "file" or "dir" when the
    option names a path the command writes (checked before it runs: ``check_outputs``)."""
    meta = {"help": help, "flags": flags, "metavar": metavar, "choices": choices, "group": group}
    meta.update(remainder=remainder, nargs=nargs, const=const, output=output)
    if isinstance(default, list):
        return dataclasses.field(default_factory=lambda: list(default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def _base_type(tp: Any) -> Any:
    """``int | None`` -> int; ``list[str]`` -> list; other types as they are."""
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return args[0] if len(args) == 1 else str
    origin = typing.get_origin(tp)
    return list if origin in (list, collections.abc.Sequence) else origin or tp


def add_options(parser: argparse.ArgumentParser, cls: type) -> None:
    """Add one argument per field of the dataclass ``cls`` (argument groups by the fields' ``group``)."""
    hints = typing.get_type_hints(cls)
    groups: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        m = f.metadata
        target: Any = parser
        if m.get("group"):
            target = groups.setdefault(m["group"], parser.add_argument_group(m["group"]))
        if m.get("remainder"):
            target.add_argument(f.name, nargs=argparse.REMAINDER, help=m["help"])
            continue
        flags = m.get("flags") or ("--" + f.name.replace("_", "-"),)
        kw: dict[str, Any] = {"dest": f.name, "help": m["help"]}
        tp = _base_type(hints[f.name])
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if tp is bool:
            kw["action"] = "store_true"
        elif tp is list:
            kw.update(action="append", default=default)
        else:
            kw["type"] = tp
            if default is dataclasses.MISSING:
                kw["required"] = True
            else:
                kw["default"] = default
        for key in ("metavar", "choices", "nargs", "const"):
            if m.get(key) is not None:
                kw[key] = m[key]
        target.add_argument(*flags, **kw)
        if m.get("output"):
            mark_output(parser, f.name, m["output"], flags[0])


def options_from(cls: type[T], args: argparse.Namespace) -> T:
    """The dataclass ``cls`` filled from parsed arguments (fields argparse did not set keep their default)."""
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    return cls(**{k: v for k, v in vars(args).items() if k in names})


def mark_output(parser: argparse.ArgumentParser, dest: str, kind: str, flag: str) -> None:
    """Declare that option ``dest`` (shown as ``flag``) names a ``kind`` ("file" or "dir") the command
    writes, so ``check_outputs`` checks it before the command runs."""
    parser.set_defaults(**{OUTPUT + dest: (kind, flag)})


def check_outputs(args: argparse.Namespace) -> str | None:
    """The first output path given on the command line that cannot be written, as one line for the user
    ("cannot write --html /proc/x.html: ..."); None when every one can (or none was given)."""
    for key, (kind, flag) in sorted((k, v) for k, v in vars(args).items() if k.startswith(OUTPUT)):
        path = getattr(args, key[len(OUTPUT) :], None)
        if isinstance(path, str) and path and path != "-":
            why = output_problem(path, kind)
            if why:
                return f"cannot write {flag} {path}: {why}"
    return None


def output_problem(path: str | os.PathLike[str], kind: str = "file") -> str | None:
    """Why ``path`` cannot be written as a ``kind`` ("file": a file, its folders made as needed; "dir": a
    folder to write files in), or None. Tried for real (a temporary file created and removed where the
    output would go), since permission bits do not tell: root may write anywhere but in /proc."""
    p = Path(path).expanduser()
    if kind == "file" and p.is_dir():
        return "it is a directory"
    if kind == "dir" and p.exists() and not p.is_dir():
        return "it is not a directory"
    if kind == "file" and p.exists():
        try:
            with open(p, "a"):
                pass
        except OSError as e:
            return e.strerror or str(e)
    folder = p if kind == "dir" else p.parent
    while not folder.exists() and folder != folder.parent:  # made when the output is written
        folder = folder.parent
    if not folder.is_dir():
        return f"{folder} is not a directory"
    try:
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".pitstop-write-test-")
    except OSError as e:
        return f"{e.strerror or e} (in {folder})"
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(probe)
    return None
