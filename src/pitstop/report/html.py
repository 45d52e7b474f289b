"""Self-contained HTML form of a Report, with inline SVG charts. No scripts, no external resources.

Every string that reaches the page goes through ``esc``; charts take numbers and escape their labels.
Callers add measured content as Blocks made by the helpers here (table, bar_chart, stacked_bar,
line_chart), so escaping lives in one place.
"""

from __future__ import annotations

import html
import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from pitstop.findings import Report, by_area
from pitstop.report.jsonfmt import atomic_write_text
from pitstop.report.stacked import cost_text
from pitstop.units import duration

PALETTE = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f"]
SEV_COLOR = {"error": "#c62828", "warn": "#b26a00", "info": "#1565c0", "pass": "#2e7d32"}


def esc(value: object) -> str:
    return html.escape(str(value), quote=True)


@dataclass(frozen=True)
class Block:
    """A fragment of the page whose strings are already escaped. Build with the helpers below. A ``lead``
    block (a headline) goes above the finding counts, the others below them."""

    html: str
    lead: bool = False


def _fmt(v: object) -> str:
    if isinstance(v, float):
        if not math.isfinite(v):
            return "–"
        return f"{v:.4g}"
    return "–" if v is None else str(v)


def table(title: str, headers: Sequence[str], rows: Iterable[Sequence[object]]) -> Block:
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{esc(_fmt(c))}</td>" for c in r) + "</tr>" for r in rows)
    return Block(f"<section><h2>{esc(title)}</h2><table><tr>{head}</tr>{body}</table></section>")


def bar_chart(title: str, labels: Sequence[str], values: Sequence[float], unit: str = "") -> Block:
    """Horizontal bars, one per label."""
    vals = [v if math.isfinite(v) else 0.0 for v in values]
    vmax = max(vals, default=0.0) or 1.0
    row_h, label_w, bar_w = 24, 220, 420
    h = row_h * len(vals) + 10
    parts = []
    for i, (lab, v) in enumerate(zip(labels, vals, strict=True)):
        y = 5 + i * row_h
        w = bar_w * v / vmax
        parts.append(
            f'<text x="{label_w - 6}" y="{y + 15}" text-anchor="end">{esc(lab)}</text>'
            f'<rect x="{label_w}" y="{y + 3}" width="{w:.1f}" height="{row_h - 8}" fill="{PALETTE[i % len(PALETTE)]}">'
            f"<title>{esc(lab)}: {esc(_amount(v, unit))}</title></rect>"
            f'<text x="{label_w + w + 4:.1f}" y="{y + 15}">{esc(_amount(v, unit))}</text>'
        )
    svg = f'<svg class="chart" viewBox="0 0 {label_w + bar_w + 120} {h}" width="100%" role="img">{"".join(parts)}</svg>'
    return Block(f"<section><h2>{esc(title)}</h2>{svg}</section>")


def _amount(v: float, unit: str) -> str:
    """A value with its unit; seconds as ``units.duration`` writes them (``65.2 ms``, ``1.75 s``)."""
    return duration(v) if unit == "s" else f"{_fmt(v)} {unit}"


def stacked_bar(title: str, parts: dict[str, float], unit: str = "s") -> Block:
    """One bar split into named parts (e.g. a step: data wait / copy / compute / optimizer)."""
    clean = {k: (v if math.isfinite(v) and v > 0 else 0.0) for k, v in parts.items()}
    total = sum(clean.values()) or 1.0
    x, width, segs, legend = 0.0, 760.0, [], []
    for i, (name, v) in enumerate(clean.items()):
        w = width * v / total
        color = PALETTE[i % len(PALETTE)]
        segs.append(
            f'<rect x="{x:.1f}" y="0" width="{w:.1f}" height="34" fill="{color}">'
            f"<title>{esc(name)}: {esc(_amount(v, unit))} ({100 * v / total:.1f}%)</title></rect>"
        )
        legend.append(
            f'<span class="key"><i style="background:{color}"></i>{esc(name)} {esc(_amount(v, unit))} '
            f"({100 * v / total:.1f}%)</span>"
        )
        x += w
    svg = f'<svg class="chart" viewBox="0 0 {width:.0f} 34" width="100%" role="img">{"".join(segs)}</svg>'
    return Block(f'<section><h2>{esc(title)}</h2>{svg}<div class="legend">{"".join(legend)}</div></section>')


def ticks(lo: float, hi: float, n: int = 5, whole: bool = False) -> list[float]:
    """Round tick values (1, 2, 2.5, 5 x 10^k apart; ``whole``: integers only, as step numbers) covering
    [lo, hi]; the first and last enclose it."""
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        return [lo, lo + 1.0]
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    steps = (1, 2, 5, 10) if whole else (1, 2, 2.5, 5, 10)
    step = next(m * mag for m in steps if m * mag >= raw * (1 - 1e-9))
    step = max(1.0, round(step)) if whole else step
    first, last = math.floor(lo / step + 1e-9), math.ceil(hi / step - 1e-9)
    return [round(k * step, 12) for k in range(first, last + 1)]


def _tick_label(v: float) -> str:
    return f"{v:.6g}"


def line_chart(
    title: str,
    x: Sequence[float],
    series: dict[str, Sequence[float]],
    xlabel: str = "",
    ylabel: str = "",
    *,
    zero: bool = True,
    shade: tuple[float, float, str] | None = None,
) -> Block:
    """Lines over a shared x axis (e.g. per-step times), each series its own colour, on axes with round
    ticks and grid lines. ``zero``: the y axis starts at 0 (durations); else it spans the data (a loss).
    ``shade``: an x range drawn grey with its label (the warm-up steps)."""
    W, H, L, B = 760, 260, 64, 40
    xs = [float(v) for v in x]
    ys = [float(v) for s in series.values() for v in s if math.isfinite(float(v))]
    if not xs or not ys:
        return Block(f"<section><h2>{esc(title)}</h2><p>no data</p></section>")
    xt = ticks(min(xs), max(xs) if max(xs) > min(xs) else min(xs) + 1, whole=all(v == int(v) for v in xs))
    ylo = min(0.0, min(ys)) if zero else min(ys)
    yhi = max(ys) if max(ys) > ylo else ylo + (abs(ylo) * 0.1 or 1.0)
    yt = ticks(ylo, yhi)
    x0, x1, y0, y1 = xt[0], xt[-1], yt[0], yt[-1]

    def px(v: float) -> float:
        return L + (W - L - 10) * (v - x0) / (x1 - x0)

    def py(v: float) -> float:
        return H - B - (H - B - 10) * (v - y0) / (y1 - y0)

    parts = []
    if shade is not None:
        a, b = max(shade[0], x0), min(shade[1], x1)
        if b > a:
            parts.append(
                f'<rect class="shade" x="{px(a):.1f}" y="10" width="{px(b) - px(a):.1f}" height="{H - B - 10}" '
                f'fill="#eee"/><text x="{(px(a) + px(b)) / 2:.1f}" y="24" text-anchor="middle" '
                f'fill="#777">{esc(shade[2])}</text>'
            )
    for v in yt:
        parts.append(
            f'<line x1="{L}" y1="{py(v):.1f}" x2="{W - 10}" y2="{py(v):.1f}" stroke="#e4e4e4"/>'
            f'<text class="ytick" x="{L - 6}" y="{py(v) + 4:.1f}" text-anchor="end">{esc(_tick_label(v))}</text>'
        )
    for v in xt:
        parts.append(
            f'<line x1="{px(v):.1f}" y1="{H - B}" x2="{px(v):.1f}" y2="{H - B + 4}" stroke="#888"/>'
            f'<text class="xtick" x="{px(v):.1f}" y="{H - B + 16}" text-anchor="middle">{esc(_tick_label(v))}</text>'
        )
    parts += [
        f'<line x1="{L}" y1="{H - B}" x2="{W - 10}" y2="{H - B}" stroke="#888"/>',
        f'<line x1="{L}" y1="10" x2="{L}" y2="{H - B}" stroke="#888"/>',
        f'<text x="{(W + L) / 2}" y="{H - 4}" text-anchor="middle">{esc(xlabel)}</text>',
        f'<text x="14" y="{(H - B) / 2}" transform="rotate(-90 14 {(H - B) / 2})" text-anchor="middle">{esc(ylabel)}</text>',
    ]
    legend = []
    for i, (name, s) in enumerate(series.items()):
        color = PALETTE[i % len(PALETTE)]
        pts = " ".join(
            f"{px(xv):.1f},{py(float(yv)):.1f}"
            for xv, yv in zip(xs, s, strict=False)
            if math.isfinite(float(yv))
        )
        parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.6" points="{pts}"/>')
        legend.append(f'<span class="key"><i style="background:{color}"></i>{esc(name)}</span>')
    svg = f'<svg class="chart" viewBox="0 0 {W} {H}" width="100%" role="img">{"".join(parts)}</svg>'
    return Block(f'<section><h2>{esc(title)}</h2>{svg}<div class="legend">{"".join(legend)}</div></section>')


CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2rem auto;max-width:1100px;color:#222;padding:0 1rem}
h1{font-size:1.5rem}h2{font-size:1.1rem;margin-top:1.6rem}
table{border-collapse:collapse;width:100%;font-size:.9rem}td,th{border-bottom:1px solid #ddd;padding:.35rem .5rem;text-align:left;vertical-align:top}
th{background:#f5f5f5}.sev{font-weight:700;text-transform:uppercase;font-size:.8rem}
pre{background:#f6f8fa;padding:.5rem;overflow-x:auto;white-space:pre-wrap;margin:.3rem 0}
.id{color:#777;font-size:.8rem}.err{background:#fdecea;border-left:4px solid #c62828;padding:.6rem}
.legend{font-size:.85rem}.key{margin-right:1rem;white-space:nowrap}.key i{display:inline-block;width:.8rem;height:.8rem;margin-right:.3rem;vertical-align:middle}
svg.chart text{font-size:12px;fill:#333}.headline{font-size:1.05rem;margin:.3rem 0}.note{color:#555;font-size:.85rem}.meta td:first-child{width:30%;color:#555}
"""


def _findings_block(report: Report) -> str:
    rows = []
    for f in (f for _, fs in by_area(report.ranked()) for f in fs):  # the terminal's order
        color = SEV_COLOR[str(f.severity)]
        fix = esc(f.fix) + (f"<pre>{esc(f.fix_code)}</pre>" if f.fix_code else "")
        where = f"<div class='id'>at {esc(f.location)}</div>" if f.location else ""
        cost = esc(cost_text(f))
        rows.append(
            f'<tr class="finding" data-id="{esc(f.id)}"><td class="sev" style="color:{color}">{esc(f.severity)}</td>'
            f"<td>{esc(f.title)}<div class='id'>{esc(f.id)}</div></td><td>{esc(f.evidence)}{where}</td>"
            f"<td>{cost}</td><td>{fix}</td></tr>"
        )
    head = "<tr><th>severity</th><th>finding</th><th>evidence</th><th>cost</th><th>fix</th></tr>"
    return f"<section><h2>Findings</h2><table id='findings'>{head}{''.join(rows)}</table></section>"


def render_html(report: Report, blocks: Sequence[Block] = ()) -> str:
    d = report.to_dict()
    s = d["summary"]
    meta_rows = "".join(
        f"<tr><td>{esc(k)}</td><td>{esc(v)}</td></tr>"
        for k, v in {
            **d["host"],
            **{k: v for k, v in d["meta"].items() if not isinstance(v, dict | list)},
        }.items()
    )
    error = f"<div class='err'><b>Error:</b><pre>{esc(report.error)}</pre></div>" if report.error else ""
    summary = (
        f"<p>{s['total']} findings: {s['error']} error, {s['warn']} warn, {s['info']} info, {s['pass']} pass. "
        f"pitstop {esc(d['pitstop_version'])}, {esc(d['created'])}.</p>"
    )
    # the run's verdict (only there when nothing warns) under the counts, as the terminal heads with it
    verdict = next((f for f in report.findings if f.area == "summary"), None)
    if verdict is not None:
        summary += f"<p class='verdict'><b>{esc(verdict.title)}</b></p>"
    lead = "".join(b.html for b in blocks if b.lead)
    body = "".join(b.html for b in blocks if not b.lead)
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        "<meta http-equiv='Content-Security-Policy' content=\"default-src 'none'; style-src 'unsafe-inline'\">"
        f"<title>pitstop {esc(report.tool)}</title><style>{CSS}</style></head><body>"
        f"<h1>pitstop {esc(report.tool)}</h1>{error}{lead}{summary}{body}{_findings_block(report)}"
        f"<section><h2>Machine</h2><table class='meta'>{meta_rows}</table></section></body></html>\n"
    )


def write_html(report: Report, path: str | os.PathLike[str], blocks: Sequence[Block] = ()) -> Path:
    return atomic_write_text(Path(path), render_html(report, blocks))
