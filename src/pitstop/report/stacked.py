"""Findings for terminals narrower than a table needs: one block per finding, nothing cut.

The finding id, its cost and its file:line are what a user copies, so they get lines of their own and
fold (never end in "…") when longer than the terminal. Code snippets keep their lines, indented.
Also the "checked, no gain here" list of passes under the summary, at any width.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from rich.console import Console
from rich.rule import Rule
from rich.text import Text

from pitstop.findings import Finding, Severity
from pitstop.units import duration

WIDE = 120  # columns from which the findings table keeps every id and file:line on one line


def cost_text(f: Finding) -> str:
    """``974 ms/step (82%)`` for a per-step cost, ``12.5 s`` for a total (``units.duration``: 3 significant
    digits); empty when not measured."""
    if f.est_saving_s is None:
        return ""
    if f.share is None:
        return duration(f.est_saving_s)
    return f"{duration(f.est_saving_s)}/step ({100 * f.share:.0f}%)"


def print_stacked(
    areas: Sequence[tuple[str, Sequence[Finding]]],
    console: Console,
    severity_text: Callable[[Severity], Text],
) -> None:
    """Each area under a rule; each finding: severity, id and cost; title; at file:line; evidence; fix."""
    for area, findings in areas:
        console.print(Rule(Text(area, style="bold magenta"), align="left"))
        for f in findings:
            head = severity_text(f.severity) + Text("  ") + Text(f.id, style="bold")
            cost = cost_text(f)
            if cost:
                head += Text(f"  {cost}", style="bold")
            console.print(head, overflow="fold")
            console.print(Text(f.title), overflow="fold")
            if f.location:
                console.print(Text("at ", style="dim") + Text(f.location), overflow="fold")
            if f.evidence:
                console.print(Text(f.evidence, style="dim"), overflow="fold")
            if f.fix:
                console.print(Text("fix: ", style="bold") + Text(f.fix), overflow="fold")
            if f.fix_code:
                for line in f.fix_code.splitlines():
                    console.print(Text(f"    {line}", style="green"), overflow="fold")
            console.print()


def print_passes(findings: Sequence[Finding], console: Console) -> None:
    """What was checked and measured not to help here, with its numbers (under the summary line)."""
    passes = [f for f in findings if f.severity is Severity.PASS]
    if not passes:
        return
    console.print(Text("Checked, no gain here:", style="green"))
    for f in passes:
        line = Text("  ✓ ", style="green") + Text(f.id, style="bold") + Text(f": {f.title}")
        if f.evidence:
            line += Text(f" ({f.evidence})", style="dim")
        console.print(line, overflow="fold")


def print_problems(findings: Sequence[Finding], console: Console, more: str = "--all lists them") -> None:
    """The footer of a list of checks: each error and warning on one line, then how many passed."""
    problems = [f for f in findings if f.severity in (Severity.ERROR, Severity.WARN)]
    console.print(Text("Problems:" if problems else "No problems (no error or warning).", style="bold"))
    for f in problems:
        style = "bold red" if f.severity is Severity.ERROR else "yellow"
        line = Text(f"  {str(f.severity).upper():<5} ", style=style) + Text(f.id, style="bold")
        console.print(line + Text(f": {f.title}"), overflow="fold")
    n = sum(f.severity is Severity.PASS for f in findings)
    if n:
        console.print(Text(f"{n} checks passed ({more})", style="green"))
