"""Terminal form of a Report: rich tables grouped by area, worst first."""

from __future__ import annotations

from itertools import groupby

from rich.console import Console
from rich.table import Table
from rich.text import Text

from pitstop.findings import Finding, Report, Severity

SEVERITY_STYLE = {
    Severity.ERROR: "bold red",
    Severity.WARN: "yellow",
    Severity.INFO: "cyan",
    Severity.PASS: "green",
}


def severity_text(sev: Severity) -> Text:
    return Text(str(sev).upper(), style=SEVERITY_STYLE[sev])


def print_report(report: Report, console: Console | None = None, show_pass: bool = True) -> None:
    """Print findings grouped by area; areas ordered by their worst finding, findings worst first."""
    console = console or Console()
    title = f"pitstop {report.tool}"
    if report.error:
        console.print(Text(f"{title}: {report.error}", style="bold red"))
    findings = [f for f in report.ranked() if show_pass or f.severity is not Severity.PASS]
    areas: dict[str, list[Finding]] = {}
    for area, group in groupby(sorted(findings, key=lambda f: f.area), key=lambda f: f.area):
        areas[area] = sorted(group, key=lambda f: (-f.severity.rank, -(f.est_saving_s or 0.0), f.id))
    order = sorted(areas, key=lambda a: (-areas[a][0].severity.rank, -(areas[a][0].est_saving_s or 0.0), a))
    table = Table(title=title, show_lines=False, expand=True)
    table.add_column("", width=5, no_wrap=True)
    table.add_column("check", style="bold", ratio=2)
    table.add_column("evidence", ratio=4)
    table.add_column("fix", ratio=4)
    for area in order:
        table.add_section()
        table.add_row(Text(""), Text(area, style="bold magenta"), Text(""), Text(""))
        for f in areas[area]:
            fix = f.fix + (f"\n{f.fix_code}" if f.fix_code else "")
            where = f"\n@ {f.location}" if f.location else ""
            # Text objects, not markup strings: user strings may contain "[...]".
            check = Text(f.title) + Text(f"\n{f.id}", style="dim")
            table.add_row(severity_text(f.severity), check, Text(f.evidence + where), Text(fix))
    console.print(table)
    s = report.to_dict()["summary"]
    console.print(
        f"[bold]{s['total']}[/bold] checks: [red]{s['error']} error[/red], [yellow]{s['warn']} warn[/yellow], "
        f"[cyan]{s['info']} info[/cyan], [green]{s['pass']} pass[/green]"
    )
