"""Terminal form of a Report: findings grouped by area, worst first; a table from ``WIDE`` columns, one
block per finding below (``pitstop.report.stacked``), so ids, costs and file:line are never cut."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from pitstop.findings import Finding, Report, Severity, by_area
from pitstop.report.stacked import WIDE, cost_text, print_passes, print_problems, print_stacked

SEVERITY_STYLE = {
    Severity.ERROR: "bold red",
    Severity.WARN: "yellow",
    Severity.INFO: "cyan",
    Severity.PASS: "green",
}


def severity_text(sev: Severity) -> Text:
    return Text(str(sev).upper(), style=SEVERITY_STYLE[sev])


def print_report(
    report: Report, console: Console | None = None, show_pass: bool = True, passes: str = "list"
) -> None:
    """Print findings grouped by area (``by_area``: the run's verdict first), then the counts.

    PASS rows go to the footer, never twice: ``passes="list"`` (measured verdicts: profile, bench, fix)
    lists them one line each under "Checked, no gain here"; ``"count"`` (checks: doctor, sysctl) names
    the problems and counts the passes; ``"all"`` prints every row in the body and only the counts below.
    ``show_pass=False`` leaves passes out entirely."""
    console = console or Console()
    title = f"pitstop {report.tool}"
    if report.error:
        console.print(Text(f"{title}: {report.error}", style="bold red"))
    ranked = report.ranked()
    body = [f for f in ranked if f.severity is not Severity.PASS or (show_pass and passes == "all")]
    areas = by_area(body)  # the run's verdict (only there when nothing warns) heads the report
    if console.width < WIDE:
        console.print(Text(title, style="bold"))
        print_stacked(areas, console, severity_text)
    else:
        _print_table(title, areas, console)
    s = report.to_dict()["summary"]
    console.print(
        f"[bold]{s['total']}[/bold] checks: [red]{s['error']} error[/red], [yellow]{s['warn']} warn[/yellow], "
        f"[cyan]{s['info']} info[/cyan], [green]{s['pass']} pass[/green]"
    )
    if show_pass and passes == "list":
        print_passes(ranked, console)
    elif show_pass and passes == "count":
        print_problems(ranked, console)


def _print_table(title: str, areas: list[tuple[str, list[Finding]]], console: Console) -> None:
    table = Table(title=title, show_lines=False, expand=True)
    table.add_column("", width=5, no_wrap=True)
    longest_id = max((len(f.id) for _, fs in areas for f in fs), default=10)
    table.add_column("check", style="bold", ratio=2, overflow="fold", min_width=min(40, longest_id))
    table.add_column("evidence", ratio=4, overflow="fold")
    table.add_column("fix", ratio=4, overflow="fold")
    for area, findings in areas:
        table.add_section()
        table.add_row(Text(""), Text(area, style="bold magenta"), Text(""), Text(""))
        for f in findings:
            fix = f.fix + (f"\n{f.fix_code}" if f.fix_code else "")
            where = f"\n@ {f.location}" if f.location else ""
            cost = cost_text(f)
            # Text objects, not markup strings: user strings may contain "[...]".
            check = Text(f.title) + Text(f"\n{f.id}", style="dim") + Text(f"\n{cost}" if cost else "")
            table.add_row(severity_text(f.severity), check, Text(f.evidence + where), Text(fix))
    console.print(table)
