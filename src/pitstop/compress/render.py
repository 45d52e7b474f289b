"""Terminal and HTML forms of the compress comparison table. Reads measured rows; measures nothing."""

from __future__ import annotations

from typing import Any

from rich.table import Table
from rich.text import Text

from pitstop.findings import Report
from pitstop.report.html import Block, bar_chart, table

HTML_HEADERS = (
    "method",
    "params",
    "nonzero params",
    "saved KB",
    "smaller x",
    "gzip KB",
    "batch 1 ms",
    "batch N ms",
    "speed-up batch 1",
    "speed-up batch N",
    "accuracy %",
    "weights zero %",
    "library; notes",
)
TERM_HEADERS = ("method", "params", "saved KB", "batch 1 ms", "batch N ms", "accuracy %", "zeros %")


def _rows(report: Report) -> list[dict[str, Any]]:
    return list(report.sections.get("compress", {}).get("rows", []))


def _f(v: float | None, scale: float = 1.0, digits: int = 1) -> str:
    return "–" if v is None else f"{v * scale:.{digits}f}"


def _ratio(base: dict[str, Any] | None, r: dict[str, Any], key: str) -> str:
    b, v = (base or {}).get(key), r.get(key)
    return f"{b / v:.2f}" if b and v else "–"


def _baseline(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    return next((r for r in rows if r["method"] == "baseline" and not r.get("error")), None)


def _why(r: dict[str, Any]) -> str | None:
    if r.get("error"):
        return f"failed: {r['error']}"
    if not r.get("applicable", True):
        return f"not applicable: {r.get('reason', '')}"
    return None


def html_rows(report: Report) -> list[list[str]]:
    rows = _rows(report)
    base = _baseline(rows)
    out = []
    for r in rows:
        why = _why(r)
        if why:
            out.append([r["method"], *["–"] * (len(HTML_HEADERS) - 2), why])
            continue
        out.append(
            [
                r["method"],
                "–" if r.get("params") is None else f"{r['params']:,}",
                "–" if r.get("nonzero_params") is None else f"{r['nonzero_params']:,}",
                _f(r.get("size_bytes"), 1e-3),
                _ratio(base, r, "size_bytes"),
                _f(r.get("gzip_bytes"), 1e-3),
                _f(r.get("latency_b1_s"), 1e3, 3),
                _f(r.get("latency_bn_s"), 1e3, 3),
                _ratio(base, r, "latency_b1_s"),
                _ratio(base, r, "latency_bn_s"),
                _f(r.get("accuracy"), 100.0),
                _f(r.get("weight_sparsity"), 100.0),
                r.get("library", "") + (f"; {r['notes']}" if r.get("notes") else ""),
            ]
        )
    return out


def rows_table(report: Report) -> Table:
    """The comparison for the terminal: values with their ratio to the baseline in parentheses."""
    rows = _rows(report)
    base = _baseline(rows)
    meta = report.meta
    t = Table(
        title=f"pitstop compress (batch N = {meta.get('batch_n', '?')}, {meta.get('threads', '?')} threads, "
        "latency: median, interleaved rounds)",
        caption="(x) = ratio to the baseline: size and time divided into the baseline's, higher is better",
    )
    for h in TERM_HEADERS:
        t.add_column(h, overflow="fold")
    for r in rows:
        why = _why(r)
        if why:
            t.add_row(Text(r["method"]), Text(why, style="dim"), *(Text("–") for _ in TERM_HEADERS[2:]))
            continue

        def cell(key: str, scale: float, digits: int, r: dict[str, Any] = r) -> Text:
            v = _f(r.get(key), scale, digits)
            x = _ratio(base, r, key)
            return Text(v if x == "–" or r is base else f"{v} ({x}x)")

        t.add_row(
            Text(r["method"]),
            Text("–" if r.get("params") is None else f"{r['params']:,}"),
            cell("size_bytes", 1e-3, 1),
            cell("latency_b1_s", 1e3, 3),
            cell("latency_bn_s", 1e3, 3),
            Text(_f(r.get("accuracy"), 100.0)),
            Text(_f(r.get("weight_sparsity"), 100.0)),
        )
    return t


def compress_blocks(report: Report) -> list[Block]:
    rows = [r for r in _rows(report) if _why(r) is None]
    blocks = [table("Compression: baseline vs each method", HTML_HEADERS, html_rows(report))]
    if rows:
        labels = [r["method"] for r in rows]
        n = report.meta.get("batch_n", "N")

        def values(key: str, scale: float) -> list[float]:
            return [(r.get(key) or 0.0) * scale for r in rows]

        blocks += [
            bar_chart("Saved size (torch.save of the state_dict)", labels, values("size_bytes", 1e-3), "KB"),
            bar_chart("Latency at batch 1 (median)", labels, values("latency_b1_s", 1e3), "ms"),
            bar_chart(f"Latency at batch {n} (median)", labels, values("latency_bn_s", 1e3), "ms"),
            bar_chart("Accuracy on the eval data", labels, values("accuracy", 100.0), "%"),
        ]
    return blocks
