"""pitstop.cliopts: argparse options built from a dataclass, and the dataclass filled from parsed arguments."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass

import pytest

from pitstop.cli import build_parser
from pitstop.cliopts import add_options, opt, options_from


@dataclass
class Example:
    spec: str = opt(help="required, no default", metavar="SPEC")
    count: int = opt(3, "an int")
    limit: float | None = opt(None, "an optional float")
    fast: bool = opt(False, "a switch", flags=("--fast", "-f"))
    mode: str = opt("a", "one of a, b", choices=("a", "b"), group="modes")
    env: Sequence[str] = opt([], "repeatable", metavar="KEY=VALUE")
    cmd: Sequence[str] | None = opt(None, "after --", remainder=True)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="x", exit_on_error=False)
    add_options(p, Example)
    return p


def test_types_defaults_flags_and_remainder():
    o = options_from(Example, _parser().parse_args(["--spec", "m:f", "-f", "--limit", "2.5", "--env", "A=1",
                                                    "--env", "B=2", "--", "run", "--x"]))  # fmt: skip
    assert o == Example(spec="m:f", count=3, limit=2.5, fast=True, mode="a", env=["A=1", "B=2"],
                        cmd=["--", "run", "--x"])  # fmt: skip
    d = options_from(Example, _parser().parse_args(["--spec", "s"]))
    assert (d.count, d.limit, d.fast, d.env, d.cmd) == (3, None, False, [], [])


def test_required_choices_and_groups():
    p = _parser()
    with pytest.raises(SystemExit):
        p.parse_args([])  # --spec is required
    with pytest.raises(argparse.ArgumentError):
        p.parse_args(["--spec", "s", "--mode", "c"])
    assert "modes" in [g.title for g in p._action_groups]
    assert "KEY=VALUE" in p.format_help() and "SPEC" in p.format_help()


def test_each_commands_defaults_are_its_options_dataclass_defaults():
    from pitstop.doctor.cli import DoctorArgs
    from pitstop.launch.cli import LaunchArgs, MonitorArgs, SysctlArgs
    from pitstop.tune.cli_options import BatchSizeArgs, LoaderArgs, LRArgs

    p = build_parser()
    for argv, cls in [(["doctor"], DoctorArgs), (["launch"], LaunchArgs), (["sysctl"], SysctlArgs),
                      (["monitor"], MonitorArgs), (["tune", "loader"], LoaderArgs),
                      (["tune", "batch-size"], BatchSizeArgs), (["tune", "lr"], LRArgs)]:  # fmt: skip
        o = options_from(cls, p.parse_args(argv))
        expected = cls()
        if hasattr(expected, "cmd"):
            expected.cmd = []  # argparse gives an empty remainder
        assert o == expected, cls.__name__
