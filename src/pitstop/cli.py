"""`pitstop` command line. Sub-commands only parse arguments and call the library.

Each area registers its own sub-commands from ``pitstop.<area>.cli.register(subparsers)``, so adding a
command never touches this file's logic. Exit codes: 0 ok, 1 error findings under --strict (or the
profiled script failed), 2 usage error, 130 interrupted.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from pitstop import __version__

COMMAND_MODULES = (
    "pitstop.doctor.cli",  # doctor
    "pitstop.profile.cli",  # profile
    "pitstop.tune.cli",  # tune, fix
    "pitstop.bench.cli",  # bench
    "pitstop.compress.cli",  # compress
    "pitstop.launch.cli",  # launch, sysctl, monitor
    "pitstop.report.compare_cli",  # compare
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pitstop",
        description="Measure why PyTorch training is slow on this machine, prove the fix, apply it.",
    )
    parser.add_argument("--version", action="version", version=f"pitstop {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        from pitstop.cliutil import EXIT_INTERRUPTED

        print("pitstop: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
