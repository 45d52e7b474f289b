"""`pitstop` command line. Sub-commands only parse arguments and call the library.

Each area registers its own sub-commands from ``pitstop.<area>.cli.register(subparsers)``, so adding a
command never touches this file's logic. Exit codes: 0 ok, 1 error findings under --strict (or the
profiled script failed), 2 usage error, 130 interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
from collections.abc import Sequence
from typing import Any

from pitstop.version import __version__

COMMAND_MODULES = (
    "pitstop.doctor.cli",  # doctor
    "pitstop.profile.cli",  # profile
    "pitstop.tune.cli",  # tune
    "pitstop.fix.cli",  # fix
    "pitstop.bench.cli",  # bench
    "pitstop.compress.cli",  # compress
    "pitstop.launch.cli",  # launch, sysctl, monitor
    "pitstop.compare.cli",  # compare
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pitstop",
        description="Measure why PyTorch training is slow on this machine, prove the fix, apply it.",
    )
    parser.add_argument("--version", action="version", version=f"pitstop {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub, **_LENT.get(name, {}))
    return parser


def _verify(*args: Any, **kwargs: Any) -> None:
    from pitstop.fix.verify import verify

    verify(*args, **kwargs)


# What one command borrows from another, handed over here at the top so that neither imports the other:
# `pitstop profile --verify` times its top warning's fix with fix's engine (fix builds on profile).
_LENT: dict[str, dict[str, Any]] = {"pitstop.profile.cli": {"verify": _verify}}


def main(argv: Sequence[str] | None = None) -> int:
    """Parse, check the output paths (exit 2 before anything is measured), run the command. SIGTERM is
    Ctrl-C for every command: each stops, reports what it measured and exits 130."""
    from pitstop.cliopts import check_outputs
    from pitstop.cliutil import EXIT_INTERRUPTED, usage_error
    from pitstop.interrupts import sigterm_interrupts

    parser = build_parser()
    args = parser.parse_args(argv)
    problem = check_outputs(args)
    if problem:
        return usage_error(problem)
    before = {path: _file_state(path) for path in _report_paths(args)}
    try:
        with sigterm_interrupts():
            return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("pitstop: interrupted", file=sys.stderr)
        with contextlib.suppress(Exception, KeyboardInterrupt):
            _interrupted_report(args, before)
        return EXIT_INTERRUPTED


def _report_paths(args: argparse.Namespace) -> list[str]:
    """The report files the command was asked to write (not stdout)."""
    paths = (getattr(args, "json", None), getattr(args, "html", None))
    return [p for p in paths if isinstance(p, str) and p and p != "-"]


def _file_state(path: str) -> tuple[int, int, int] | None:
    """What tells a file rewritten from the same one (inode, size, mtime in ns); None where there is none.
    Compared as a whole, not as mtime against the start: the file system's clock is coarser than
    ``time.time()``, so a file written just after the start can carry an earlier mtime."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def _interrupted_report(args: argparse.Namespace, before: dict[str, tuple[int, int, int] | None]) -> None:
    """The --json / --html asked for, when Ctrl-C or SIGTERM stopped a command before it wrote its report
    (e.g. while torch was still importing): one that says so, so a caller waiting for the file finds it.
    A file the command has written (changed since ``before``, or new) is its own report and is left as it is."""
    from pitstop.findings import Report
    from pitstop.report import write_html, write_json

    def unwritten(path: str | None) -> bool:
        return path in before and _file_state(path) == before[path]

    sub = getattr(args, "tune_command", None) or getattr(args, "compress_command", None)
    tool = " ".join(str(v) for v in (args.command, sub) if v)
    error = "interrupted (Ctrl-C or SIGTERM) before the command had measurements to report"
    report = Report(tool=tool, error=error, meta={"interrupted": True})
    if unwritten(getattr(args, "json", None)):
        write_json(report, args.json)
    if unwritten(getattr(args, "html", None)):
        write_html(report, args.html)


def entry() -> None:
    """The ``pitstop`` console script: ``main``, then exit with its code. After Ctrl-C or SIGTERM the
    exit skips the interpreter's teardown (torch's takes seconds on a busy machine), so pitstop is gone
    within the 2 s it promises; the report is written by then and stdout/stderr are flushed here."""
    code = main()
    if code == 130:  # cliutil.EXIT_INTERRUPTED
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    entry()
