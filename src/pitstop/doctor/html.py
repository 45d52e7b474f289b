"""The doctor's extra HTML content: the machine inventory as a facts table (escaped by report.html)."""

from __future__ import annotations

from pitstop.findings import Report
from pitstop.report.html import Block, table


def doctor_blocks(report: Report) -> list[Block]:
    rows = report.sections.get("doctor", {}).get("inventory", [])
    if not rows:
        return []
    # Every raw fact (one row per finding data field) stays in the JSON under sections.doctor.facts.
    return [table("Machine inventory", ["", "measured or read on this machine"], rows)]
