"""What every reporting sub-command shares: output flags, progress on stderr, terminal tables, comma lists,
and writing the Report they produce."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.text import Text

from pitstop.cliopts import mark_output
from pitstop.findings import Report, Severity
from pitstop.report import print_report, to_json, write_html, write_json
from pitstop.report.html import Block

if TYPE_CHECKING:
    from rich.progress import Progress as ProgressType

EXIT_OK, EXIT_FINDINGS, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


def add_output_args(parser: argparse.ArgumentParser, html: bool = True) -> None:
    g = parser.add_argument_group("output")
    g.add_argument("--json", metavar="FILE", help="write the report as JSON ('-' for stdout)")
    mark_output(parser, "json", "file", "--json")
    if html:
        g.add_argument("--html", metavar="FILE", help="write a self-contained HTML report")
        mark_output(parser, "html", "file", "--html")
    g.add_argument("--strict", action="store_true", help="exit 1 when any finding is at error severity")
    g.add_argument("--quiet", "-q", action="store_true", help="no terminal table")


def finish(
    report: Report, args: argparse.Namespace, blocks: Sequence[Block] = (), passes: str = "list"
) -> int:
    """Write the report where asked, print it unless quiet or JSON goes to stdout (PASS rows as
    ``print_report``'s ``passes`` says); return the exit code:
    130 when the command was interrupted (``report.meta["interrupted"]``: Ctrl-C stopped it and the report
    holds what was measured), 1 for error findings under --strict, else 0."""
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
    if shows_tables(args):
        print_report(report, Console(), passes=passes)
    if report.meta.get("interrupted"):
        return EXIT_INTERRUPTED
    if getattr(args, "strict", False) and report.worst() is Severity.ERROR:
        return EXIT_FINDINGS
    return EXIT_OK


def command_after_dashes(args: argparse.Namespace, attr: str = "cmd") -> list[str]:
    """The user's command given after ``--`` (argparse REMAINDER keeps the ``--`` itself)."""
    cmd = list(getattr(args, attr, None) or [])
    return cmd[1:] if cmd[:1] == ["--"] else cmd


def usage_error(message: str) -> int:
    """``pitstop: message`` on stderr, one line however narrow the terminal; returns exit code 2."""
    Console(stderr=True).print(Text("pitstop: ", style="bold red") + Text(message), soft_wrap=True)
    return EXIT_USAGE


def shows_tables(args: argparse.Namespace) -> bool:
    """Terminal output is printed unless --quiet, or the JSON report goes to stdout."""
    return not getattr(args, "quiet", False) and getattr(args, "json", None) != "-"


def comma_list(text: str | None) -> tuple[str, ...]:
    """``"a, b,,c"`` -> ("a", "b", "c"); None or "" -> ()."""
    return tuple(v.strip() for v in (text or "").split(",") if v.strip())


def progress_bar(label: str, show: bool, *, bar: bool = True) -> ProgressType:
    """The transient progress display long commands share, on stderr: ``label``, the task's description and,
    with ``bar``, a bar with done/total and the elapsed time; without it, a spinner. Hidden unless ``show``."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
    )

    text = TextColumn(f"{label} {{task.description}}")
    columns = (
        (text, BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()) if bar else (SpinnerColumn(), text)
    )
    return Progress(*columns, console=Console(stderr=True), transient=True, disable=not show)


@contextmanager
def status(label: str, show: bool = True) -> Iterator[Callable[[str], None]]:
    """A spinner line on stderr while the block runs; yields ``update(msg)``, which shows ``label: msg``."""
    if not show:
        yield lambda msg: None
        return
    with Console(stderr=True).status(label) as st:
        yield lambda msg: st.update(f"{label}: {msg}")


def print_table(args: argparse.Namespace, title: str, headers: list[str], rows: list[list[Any]]) -> None:
    """A measured table on the terminal (the HTML report has the same rows), unless ``shows_tables`` says no."""
    if not shows_tables(args):
        return
    from rich.table import Table

    t = Table(title=title)
    for h in headers:
        t.add_column(h)
    for r in rows:
        t.add_row(*(Text("–" if v is None else f"{v:.4g}" if isinstance(v, float) else str(v)) for v in r))
    Console().print(t)
