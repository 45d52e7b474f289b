"""HTML views of a multi-rank report: per-rank breakdowns side by side, a per-rank timeline, the skew.

Built only from ``Report.sections["ranks"]`` and ``["distributed"]``, so a saved JSON report renders the same.
"""

from __future__ import annotations

import math
from typing import Any

from pitstop.findings import Report
from pitstop.report.html import Block, line_chart, stacked_bar, table
from pitstop.units import duration

COLUMNS = (
    ("data wait", "data_wait_s"),
    ("forward", "forward_s"),
    ("backward compute", "backward_compute_s"),
    ("waiting in collectives", "wait_s"),
    ("optimizer", "optimizer_s"),
    ("host syncs", "sync_s"),
    ("other", "other_s"),
)


def _parts(r: dict[str, Any]) -> dict[str, float]:
    """A rank's mean step, with the time it was blocked in collectives as a part of its own."""
    bd = r["breakdown"]
    c = r["comm_per_step"]
    wait = c["ddp_exposed_s"] + c["collective_s"]
    other = max(0.0, bd["other_s"] - c["collective_s"])
    return {
        "data_wait_s": bd["data_wait_s"] + bd.get("h2d_s", 0.0),
        "forward_s": bd["forward_s"],
        "backward_compute_s": max(0.0, bd["backward_s"] - c["ddp_exposed_s"]),
        "wait_s": wait,
        "optimizer_s": bd["optimizer_s"],
        "sync_s": bd["sync_s"],
        "other_s": other,
    }


MS = 1000.0  # seconds to the milliseconds shown


def rank_blocks(report: Report) -> list[Block]:
    """The multi-rank views: the side-by-side breakdown, each rank's bar, the per-rank timeline, and
    the skew and explicit collective tables when the report has them; none without a measured rank."""
    ranks = [r for r in report.sections.get("ranks") or [] if r.get("breakdown")]
    if not ranks:
        return []
    blocks = [_breakdown_table(ranks)]
    for r in ranks:
        blocks.append(
            stacked_bar(
                f"Rank {r['rank']}: where a step goes ({r['measured_steps']} steps, "
                f"{duration(r['breakdown']['mean_step_s'])})",
                {label: _parts(r)[k] * MS for label, k in COLUMNS},
                unit="ms",
            )
        )
    blocks.append(_timeline(ranks))
    skew = (report.sections.get("distributed") or {}).get("skew") or {}
    if skew:
        blocks.append(_skew_table(skew))
    sites = [(r["rank"], s) for r in ranks for s in r.get("collective_sites") or []]
    if sites:
        blocks.append(
            table(
                "Explicit collectives by place",
                ["rank", "collective", "where", "calls", "bytes", "blocked ms"],
                [
                    [rk, s["op"], s["location"], s["count"], s["bytes"], round(s["time_s"] * MS, 2)]
                    for rk, s in sites
                ],
            )
        )
    return blocks


def _breakdown_table(ranks: list[dict[str, Any]]) -> Block:
    """Every rank's mean step and its parts, one row each."""
    return table(
        "Per-rank step breakdown, side by side (ms per measured step)",
        [
            "rank",
            "host",
            "status",
            "step",
            *(c for c, _ in COLUMNS),
            "DDP all-reduce",
            "all-reduces/step",
        ],
        [
            [r["rank"], r["host"], r["status"], round(r["breakdown"]["mean_step_s"] * MS, 2)]
            + [round(_parts(r)[k] * MS, 2) for _, k in COLUMNS]
            + [round(r["comm_per_step"]["ddp_comm_s"] * MS, 2), r["comm_per_step"]["ddp_rounds"]]
            for r in ranks
        ],
    )


def _timeline(ranks: list[dict[str, Any]]) -> Block:
    """Each rank's measured steps (step, data wait, waiting in collectives) on the longest rank's step
    indices; shorter ranks are padded with zeros."""
    series: dict[str, list[float]] = {}
    x: list[float] = []
    for r in ranks:
        steps = [s for s in r["steps"] if not s.get("warmup")]
        per = r.get("comm_steps") or {}
        x = [float(s["index"]) for s in steps] if len(steps) > len(x) else x
        series[f"rank {r['rank']} step"] = [s["total_s"] * MS for s in steps]
        series[f"rank {r['rank']} data"] = [s["data_wait_s"] * MS for s in steps]
        series[f"rank {r['rank']} waiting"] = [_waiting(per.get(str(s["index"])) or {}) * MS for s in steps]
    n = len(x)
    return line_chart(
        "Per-rank timeline of the measured steps (step, data wait, waiting in collectives)",
        x,
        {k: (v + [0.0] * n)[:n] for k, v in series.items()},
        xlabel="step",
        ylabel="ms",
    )


def _skew_table(skew: dict[str, dict[str, Any]]) -> Block:
    """How far apart the ranks reach each kind of collective, and which rank came last how often."""
    return table(
        "Skew: how far apart the ranks reach each kind of collective",
        ["collective", "calls", "median skew ms", "max skew ms", "last to arrive (rank: times)"],
        [
            [
                op,
                row["calls"],
                round(row["median_skew_s"] * MS, 2),
                round(row["max_skew_s"] * MS, 2),
                ", ".join(f"{k}: {v}" for k, v in row["last_rank"].items()),
            ]
            for op, row in skew.items()
        ],
    )


def print_ranks(report: Report, console: Any) -> None:
    """One line per rank under the step bar: its step and where it went, waiting in collectives apart."""
    from rich.text import Text

    for r in report.sections.get("ranks") or []:
        if not r.get("breakdown"):
            console.print(Text(f"rank {r['rank']}: {r['status']}, no measured step", style="bold"))
            continue
        parts = _parts(r)
        shown = ", ".join(f"{label} {parts[k] * 1000:.1f}" for label, k in COLUMNS if parts[k] >= 0.0005)
        console.print(
            Text(f"rank {r['rank']}", style="bold")
            + Text(f" ({r['status']}): step {duration(r['breakdown']['median_step_s'])} median; {shown} ms")
        )


def _waiting(row: dict[str, Any]) -> float:
    """A step's time waiting in collectives; NaN (not drawn) for a step whose DDP rounds were not timed
    (the reducer's timers are read on a sample of iterations)."""
    if row.get("ddp_rounds", 0) > row.get("ddp_timed_rounds", row.get("ddp_rounds", 0)):
        return math.nan
    return row.get("ddp_exposed_s", 0.0) + row.get("collective_s", 0.0)
