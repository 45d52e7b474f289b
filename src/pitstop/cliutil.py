"""What every reporting sub-command shares: output flags and writing the Report they produce."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from rich.console import Console
from rich.text import Text

from pitstop.findings import Report, Severity
from pitstop.report import print_report, to_json, write_html, write_json
from pitstop.report.html import Block

EXIT_OK, EXIT_FINDINGS, EXIT_USAGE = 0, 1, 2


def add_output_args(parser: argparse.ArgumentParser, html: bool = True) -> None:
    g = parser.add_argument_group("output")
    g.add_argument("--json", metavar="FILE", help="write the report as JSON ('-' for stdout)")
    if html:
        g.add_argument("--html", metavar="FILE", help="write a self-contained HTML report")
    g.add_argument("--strict", action="store_true", help="exit 1 when any finding is at error severity")
    g.add_argument("--quiet", "-q", action="store_true", help="no terminal table")


def finish(report: Report, args: argparse.Namespace, blocks: Sequence[Block] = ()) -> int:
    """Write the report where asked, print it unless quiet or JSON goes to stdout; return the exit code."""
    json_path = getattr(args, "json", None)
    html_path = getattr(args, "html", None)
    err = Console(stderr=True)
    if json_path == "-":
        sys.stdout.write(to_json(report) + "\n")
    elif json_path:
        write_json(report, json_path)
        err.print(f"JSON report: {json_path}")
    if html_path:
        write_html(report, html_path, blocks)
        err.print(f"HTML report: {html_path}")
    if not getattr(args, "quiet", False) and json_path != "-":
        print_report(report, Console())
    if getattr(args, "strict", False) and report.worst() is Severity.ERROR:
        return EXIT_FINDINGS
    return EXIT_OK


def command_after_dashes(args: argparse.Namespace, attr: str = "cmd") -> list[str]:
    """The user's command given after ``--`` (argparse REMAINDER keeps the ``--`` itself)."""
    cmd = list(getattr(args, attr, None) or [])
    return cmd[1:] if cmd[:1] == ["--"] else cmd


def usage_error(message: str) -> int:
    Console(stderr=True).print(Text("pitstop: ", style="bold red") + Text(message))
    return EXIT_USAGE
