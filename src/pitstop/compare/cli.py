"""``pitstop compare A.json B.json [...]``: JSON reports of one kind side by side, the first as baseline."""

from __future__ import annotations

import argparse
from pathlib import Path

from pitstop.cliutil import add_output_args, finish, shows_tables, usage_error


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparsers.add_parser(
        "compare",
        help="compare saved reports (before/after): step time, steps/s, findings, speed-up",
        description="Put JSON reports of the same kind side by side, the first as the baseline: step time "
        "and its parts, steps/s, findings that disappeared or appeared, and the speed-up with the timing "
        "engine's interval where both reports carry per-step samples (profile reports do).",
    )
    p.add_argument("reports", nargs="+", metavar="REPORT.json", help="two or more reports (--json output)")
    add_output_args(p)
    p.set_defaults(func=cmd_compare)


def cmd_compare(args: argparse.Namespace) -> int:
    from rich.console import Console

    from pitstop.compare.reports import CompareError, compare, html_blocks, print_compare, read_report

    if len(args.reports) < 2:
        return usage_error("compare needs at least two reports")
    try:
        reports = [read_report(path) for path in args.reports]
        result = compare(reports, _labels(args.reports))
    except CompareError as e:
        return usage_error(str(e))
    if shows_tables(args):
        print_compare(result, Console())
    return finish(result, args, html_blocks(result))


def _labels(paths: list[str]) -> list[str]:
    """File names, or whole paths where two reports share a name."""
    names = [Path(p).name for p in paths]
    return names if len(set(names)) == len(names) else list(paths)
