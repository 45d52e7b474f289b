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
"""

from __future__ import annotations

import argparse
import collections.abc
import dataclasses
import types
import typing
from typing import Any, TypeVar

T = TypeVar("T")


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
) -> Any:
    """A dataclass field that is also a command-line option (``nargs="?"`` with ``const``: the value
    given, ``const`` for the bare flag, the default without it)."""
    meta = {"help": help, "flags": flags, "metavar": metavar, "choices": choices, "group": group}
    meta.update(remainder=remainder, nargs=nargs, const=const)
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


def options_from(cls: type[T], args: argparse.Namespace) -> T:
    """The dataclass ``cls`` filled from parsed arguments (fields argparse did not set keep their default)."""
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    return cls(**{k: v for k, v in vars(args).items() if k in names})
