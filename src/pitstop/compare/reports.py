"""Reports of the same kind side by side: the before/after view (``pitstop compare A.json B.json ...``).

The first report is the baseline. For each later one: step time and its parts, steps/s, the findings
that disappeared or appeared, and the speed-up in throughput (steps per wall-clock second over the
measured steps, spikes included: the baseline's mean step over this one's) with its interval
(``pitstop.measure.throughput.throughput_interval``) where both reports carry per-step samples
(``sections.steps`` of a profile report); the ratio of median steps stands beside it. A report is one
run, so each side's steps are cut into consecutive blocks that stand in for the engine's rounds (block
i against block i): the interval holds the drift within the runs, not the spread between runs, and the
finding says so. Pure functions from
Reports to a Report (tool "compare"); rendering is below, separate from the numbers.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from pitstop.findings import Finding, Report, Severity
from pitstop.measure import blocks
from pitstop.measure.throughput import throughput_interval, window
from pitstop.profile.record.timeline import PART_LABELS, PARTS
from pitstop.report.html import Block, table

LEVEL = 0.95
BLOCK_STEPS = 10  # steps per block; 3 to 10 blocks a side


class CompareError(ValueError):
    """The reports cannot be compared (unreadable, not a report, different kinds, fewer than two)."""


EXPECTED = "expected a pitstop JSON report (an object with 'tool' and 'findings', as --json writes)"


def read_report(path: str) -> Report:
    """The pitstop report in the JSON file ``path``; CompareError with one line saying what was expected
    and what the file holds instead (not JSON, a list, another file's object, a compare report)."""
    try:
        data = json.loads(Path(path).read_text())
    except OSError as e:
        raise CompareError(f"cannot read {path}: {e.strerror or e}") from None
    except ValueError as e:  # UnicodeDecodeError too
        raise CompareError(f"{path} is not JSON ({e}): {EXPECTED}") from None
    if not isinstance(data, dict):
        raise CompareError(f"{path}: {EXPECTED}; got a JSON {_json_type(data)}")
    if not isinstance(data.get("tool"), str) or not isinstance(data.get("findings", []), list):
        keys = ", ".join(sorted(map(str, data))[:6]) or "none"
        raise CompareError(f"{path}: {EXPECTED}; got an object with keys {keys}")
    if data["tool"] == "compare":
        raise CompareError(f"{path} is a compare report: compare the reports it was made from")
    try:
        report = Report.from_dict(data)
        row = summary_row(report)  # everything compare reads of it
        numbers = {k: row[k] for k in ("median_step_s", "mean_step_s", "steps_per_s")} | row["parts_s"]
        bad = [k for k, v in numbers.items() if v is not None and not isinstance(v, int | float)]
        if bad:
            raise TypeError(f"{', '.join(bad)}: not a number")
    except (TypeError, KeyError, ValueError, AttributeError) as e:
        raise CompareError(f"{path}: a {data['tool']} report not as pitstop writes it: {e!r}") from None
    return report


def _json_type(value: Any) -> str:
    return {list: "list", str: "string", bool: "boolean", type(None): "null"}.get(type(value), "number")


@dataclass(frozen=True)
class Ratio:
    """Throughput of ``b`` over ``a`` (``mean(a) / mean(b)`` of step times) and its interval (None
    without enough samples), from ``blocks`` blocks; ``median``: ``median(a) / median(b)``, beside it."""

    value: float
    low: float | None
    high: float | None
    n_a: int
    n_b: int
    blocks: int = 0
    median: float | None = None


def throughput_ratio(a: Sequence[float], b: Sequence[float], level: float = LEVEL) -> Ratio:
    """The speed-up of step times ``b`` over ``a`` in steps per wall-clock second, every step counted,
    with ``measure.throughput.throughput_interval`` over consecutive blocks of about ``BLOCK_STEPS``
    steps (3 to 10 a side, the same count both sides). A pure function of the samples: the same reports
    give the same interval. No interval below 3 steps a side per block."""
    if not a or not b:
        raise ValueError("both samples need at least one value")
    value = (sum(a) / len(a)) / (sum(b) / len(b))
    median = statistics.median(a) / statistics.median(b)
    n = max(3, min(10, min(len(a), len(b)) // BLOCK_STEPS))
    if min(len(a), len(b)) < 3 * n:
        return Ratio(value, None, None, len(a), len(b), median=median)
    iv = throughput_interval([window(x) for x in blocks(a, n)], [window(x) for x in blocks(b, n)], level)
    if iv is None:
        return Ratio(value, None, None, len(a), len(b), median=median)
    return Ratio(iv.estimate, iv.lo, iv.hi, len(a), len(b), n, median)


def step_samples(report: Report) -> list[float]:
    """Measured (not warm-up) step times, seconds, from a profile report's per-step records."""
    return [float(s["total_s"]) for s in report.sections.get("steps") or [] if not s.get("warmup")]


def summary_row(report: Report) -> dict[str, Any]:
    """The numbers compared for one report (None where it does not have them)."""
    bd = report.sections.get("breakdown") or {}
    samples = step_samples(report)
    median = bd.get("median_step_s") or (statistics.median(samples) if samples else None)
    throughput = len(samples) / sum(samples) if samples and sum(samples) > 0 else None
    row: dict[str, Any] = {
        "tool": report.tool,
        "status": report.meta.get("status"),
        "command": report.meta.get("command"),
        "median_step_s": median,
        "mean_step_s": bd.get("mean_step_s"),
        # steps per wall-clock second over the measured steps where the report holds them
        "steps_per_s": throughput or report.meta.get("steps_per_s") or (1.0 / median if median else None),
        "measured_steps": len(samples) or bd.get("steps"),
        "parts_s": {p: bd[p] for p in PARTS if p in bd},
        "problems": sorted({f.id for f in report.findings if f.severity.rank >= Severity.WARN.rank}),
        "findings": sorted({f.id for f in report.findings if f.severity is not Severity.PASS}),
    }
    return row


def compare(reports: Sequence[Report], labels: Sequence[str]) -> Report:
    """One Report holding the side-by-side rows and, for each report after the first, a speed-up and a
    findings-diff Finding against the first."""
    if len(reports) < 2:
        raise CompareError("compare needs at least two reports")
    kinds = sorted({r.tool for r in reports})
    if len(kinds) > 1:
        raise CompareError(f"reports of different kinds cannot be compared: {', '.join(kinds)}")
    rows = [{"label": lab, **summary_row(r)} for lab, r in zip(labels, reports, strict=True)]
    base, base_samples = rows[0], step_samples(reports[0])
    findings: list[Finding] = []
    pairs: list[dict[str, Any]] = []
    for row, rep in zip(rows[1:], reports[1:], strict=True):
        pair: dict[str, Any] = {"baseline": base["label"], "other": row["label"]}
        samples = step_samples(rep)
        if base_samples and samples:
            r = throughput_ratio(base_samples, samples)
            pair.update(
                speedup=r.value,
                low=r.low,
                high=r.high,
                n_baseline=r.n_a,
                n_other=r.n_b,
                blocks=r.blocks,
                median_speedup=r.median,
            )
        elif base["median_step_s"] and row["median_step_s"]:
            pair.update(speedup=base["median_step_s"] / row["median_step_s"], low=None, high=None)
        pair["disappeared"] = sorted(set(base["findings"]) - set(row["findings"]))
        pair["appeared"] = sorted(set(row["findings"]) - set(base["findings"]))
        pairs.append(pair)
        findings += _pair_findings(pair, base, row)
    findings += _scope(kinds[0], rows)
    return Report(
        tool="compare",
        findings=findings,
        sections={"kind": kinds[0], "reports": rows, "pairs": pairs},
        meta={"baseline": base["label"], "reports": len(rows)},
    )


def _timed(rows: Sequence[dict[str, Any]]) -> bool:
    """Whether the reports carry step times (profile reports do; doctor, sysctl, bench ... do not)."""
    return any(r.get("median_step_s") for r in rows)


def _scope(kind: str, rows: Sequence[dict[str, Any]]) -> list[Finding]:
    """What was compared, where the reports have no step times: their findings only."""
    if _timed(rows):
        return []
    return [
        Finding(
            id="compare.scope",
            severity=Severity.INFO,
            title=f"{kind} reports compared by their findings only",
            evidence=f"{kind} reports carry no step times: step time, its parts, steps/s and the speed-up "
            "come from profile reports; here: each report's status and problems, and the findings that "
            "appeared or went",
            data={"kind": kind, "compared": ["status", "problems", "findings"]},
            fix="Compare two `pitstop profile --json` reports for step time and speed-up.",
        )
    ]


def _pair_findings(pair: dict[str, Any], base: dict[str, Any], row: dict[str, Any]) -> list[Finding]:
    out: list[Finding] = []
    a, b = pair["baseline"], pair["other"]
    if "speedup" in pair:
        s, lo, hi = pair["speedup"], pair.get("low"), pair.get("high")
        rel = f"{s:.2f}x faster than" if s >= 1 else f"{1 / s:.2f}x slower than"
        times = f"median step {1000 * base['median_step_s']:.1f} ms -> {1000 * row['median_step_s']:.1f} ms"
        if pair.get("median_speedup"):
            times = (
                f"{s:.2f}x in throughput (steps per wall-clock second over the measured steps, slow ones "
                f"included); {times} ({pair['median_speedup']:.2f}x)"
            )
        if lo is not None and hi is not None:
            interval = (
                f"; {100 * LEVEL:.0f}% interval of the throughput ratio {lo:.2f}x-{hi:.2f}x "
                f"({pair['n_baseline']} vs {pair['n_other']} measured steps in {pair.get('blocks')} "
                "blocks a side; one run each, so the spread between runs is not in it)"
            )
            clear = lo > 1 or hi < 1
        else:
            interval, clear = "; no per-step samples in both reports, so no interval", False
        out.append(
            Finding(
                id="compare.speedup",
                severity=Severity.WARN if (hi is not None and hi < 1) else Severity.INFO,
                title=f"{b} is {rel} {a}" + ("" if clear or lo is None else " (within noise)"),
                evidence=times + interval,
                data={
                    k: pair.get(k)
                    for k in ("speedup", "low", "high", "n_baseline", "n_other", "median_speedup")
                },
            )
        )
    gone, new = pair["disappeared"], pair["appeared"]
    if gone or new:
        out.append(
            Finding(
                id="compare.findings",
                severity=Severity.WARN if set(new) & set(row["problems"]) else Severity.INFO,
                title=f"Findings changed from {a} to {b}",
                evidence="; ".join(
                    p
                    for p in (
                        f"gone: {', '.join(gone)}" if gone else "",
                        f"new: {', '.join(new)}" if new else "",
                    )
                    if p
                ),
                data={"disappeared": gone, "appeared": new},
            )
        )
    return out


# ------------------------------------------------------------------------------------------- render


def _ms(v: float | None) -> str:
    return "–" if v is None else f"{1000 * v:.1f} ms"


def _rows(report: Report) -> list[tuple[str, list[str]]]:
    """(row name, one cell per compared report) for the terminal and HTML tables."""
    reps = report.sections["reports"]
    pairs = {p["other"]: p for p in report.sections["pairs"]}
    if not _timed(reps):  # no step times (a doctor report): no rows of dashes, the findings only
        status = (
            [("status", [str(r.get("status") or "–") for r in reps])]
            if any(r.get("status") for r in reps)
            else []
        )
        return [
            *status,
            ("problems", [", ".join(r["problems"]) or "none" for r in reps]),
            ("findings", [str(len(r["findings"])) for r in reps]),
        ]
    out = [
        ("status", [str(r.get("status") or "–") for r in reps]),
        ("median step", [_ms(r["median_step_s"]) for r in reps]),
    ]
    if any(r.get("mean_step_s") for r in reps):  # the parts below add up to the mean step
        out.append(("mean step", [_ms(r.get("mean_step_s")) for r in reps]))
    for p in PARTS:
        if any(p in r["parts_s"] for r in reps):
            out.append((f"  {PART_LABELS[p]}", [_ms(r["parts_s"].get(p)) for r in reps]))
    out.append(("steps/s", ["–" if not r["steps_per_s"] else f"{r['steps_per_s']:.2f}" for r in reps]))
    out.append(("measured steps", [str(r.get("measured_steps") or "–") for r in reps]))
    cells = ["baseline"]
    for r in reps[1:]:
        p = pairs[r["label"]]
        if "speedup" not in p:
            cells.append("–")
        elif p.get("low") is None:
            cells.append(f"{p['speedup']:.2f}x")
        else:
            cells.append(f"{p['speedup']:.2f}x [{p['low']:.2f}-{p['high']:.2f}]")
    out.append(("speed-up (throughput)", cells))
    out.append(("problems", [", ".join(r["problems"]) or "none" for r in reps]))
    return out


def print_compare(report: Report, console: Console | None = None) -> None:
    """The side-by-side table; one column per report (it folds, never cuts, at narrow widths)."""
    console = console or Console()
    reps = report.sections["reports"]
    t = Table(title=f"pitstop compare ({report.sections['kind']})", expand=False)
    t.add_column("", style="bold", overflow="fold")
    for r in reps:
        t.add_column(Text(r["label"]), overflow="fold")
    for name, cells in _rows(report):
        t.add_row(Text(name), *(Text(c) for c in cells))
    console.print(t)


def html_blocks(report: Report) -> list[Block]:
    reps = report.sections["reports"]
    blocks = [table("Side by side", ["", *(r["label"] for r in reps)], [[n, *c] for n, c in _rows(report)])]
    pairs = report.sections["pairs"]
    if pairs:
        blocks.append(
            table(
                "Findings that changed (against the baseline)",
                ["report", "gone", "new"],
                [
                    [p["other"], ", ".join(p["disappeared"]) or "–", ", ".join(p["appeared"]) or "–"]
                    for p in pairs
                ],
            )
        )
    return blocks
