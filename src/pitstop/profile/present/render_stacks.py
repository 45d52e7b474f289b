"""The stacks a hang, a timeout or a stall finding carries, as text and as an HTML block (escaped)."""

from __future__ import annotations

from pitstop.findings import Finding, Report
from pitstop.profile.capture.stacks import format_stack
from pitstop.report.html import Block, esc
from pitstop.units import duration

STACK_FINDINGS = ("profile.hang", "profile.timeout", "profile.stall")


def stacks_text(finding: Finding) -> str:
    """Every thread's stack for a hang or a timeout; the main thread's sampled stacks for a stall."""
    if finding.id == "profile.stall":
        return "\n\n".join(
            f"step {s['step']}, {duration(s['elapsed_s'])} into it:\n"
            + format_stack({"name": "MainThread", "main": True, "frames": s.get("frames") or []})
            for s in finding.data.get("samples") or []
        )
    return "\n\n".join(format_stack(t) for t in finding.data.get("threads") or [])


def stacks_blocks(report: Report) -> list[Block]:
    blocks = []
    for f in report.ranked():
        text = stacks_text(f) if f.id in STACK_FINDINGS else ""
        if text:
            title = f"Stacks for {f.id}" + (f" at {f.location}" if f.location else "")
            blocks.append(
                Block(f"<section><h2>{esc(title)}</h2><pre class='stacks'>{esc(text)}</pre></section>")
            )
    return blocks
