"""An SVG plot of speed-up intervals: one row per candidate, a dot at the estimate and a line over its
confidence interval, on a shared axis with 1.0x and the no-change band marked. Built from the same
escaping and palette as ``pitstop.report.html``."""

from __future__ import annotations

import math
from collections.abc import Sequence

from pitstop.report.html import Block, esc

VERDICT_COLOR = {"helped": "#2e7d32", "hurt": "#c62828", "no change": "#555", "undecided": "#b26a00"}


def interval_chart(
    title: str, rows: Sequence[tuple[str, float, float, float, str]], band: float = 0.0
) -> Block:
    """``rows``: (label, estimate, low, high, verdict). Unbounded ends are drawn to the axis edge."""
    if not rows:
        return Block(f"<section><h2>{esc(title)}</h2><p>no interval measured</p></section>")
    finite = [v for _, e, lo, hi, _ in rows for v in (e, lo, hi) if math.isfinite(v) and v > 0]
    x0 = min([*finite, 1 - band, 0.9])
    x1 = max([*finite, 1 + band, 1.1])
    pad = 0.05 * (x1 - x0)
    x0, x1 = max(0.0, x0 - pad), x1 + pad
    row_h, label_w, plot_w = 26, 260, 460
    h = row_h * len(rows) + 30

    def px(v: float) -> float:
        v = min(max(v, x0), x1) if math.isfinite(v) else x1
        return label_w + plot_w * (v - x0) / (x1 - x0)

    top, bottom = 4, h - 24
    parts = [
        f'<rect x="{px(1 - band):.1f}" y="{top}" width="{px(1 + band) - px(1 - band):.1f}" '
        f'height="{bottom - top}" fill="#eee" stroke="#999" stroke-dasharray="4 3"/>'
        if band > 0
        else "",
        f'<line x1="{px(1.0):.1f}" y1="{top}" x2="{px(1.0):.1f}" y2="{bottom}" stroke="#333"/>',
        f'<text x="{px(1.0):.1f}" y="{h - 8}" text-anchor="middle">1.00x</text>',
        f'<text x="{label_w}" y="{h - 8}">{x0:.2f}x</text>',
        f'<text x="{label_w + plot_w}" y="{h - 8}" text-anchor="end">{x1:.2f}x</text>',
    ]
    for i, (label, est, lo, hi, verdict) in enumerate(rows):
        y = top + 13 + i * row_h
        color = VERDICT_COLOR.get(verdict, "#1565c0")
        span = f"interval {lo:.3f}\u2013{hi:.3f}" if math.isfinite(hi) else "no interval yet"
        tip = f"{label}: {est:.3f}x, {span} ({verdict})"
        parts.append(
            f'<text x="{label_w - 6}" y="{y + 4}" text-anchor="end">{esc(label)}</text>'
            f'<line x1="{px(lo):.1f}" y1="{y}" x2="{px(hi):.1f}" y2="{y}" stroke="{color}" stroke-width="3">'
            f"<title>{esc(tip)}</title></line>"
            f'<circle cx="{px(est):.1f}" cy="{y}" r="5" fill="{color}"><title>{esc(tip)}</title></circle>'
            f'<text x="{label_w + plot_w + 8}" y="{y + 4}">{esc(f"{est:.2f}x {verdict}")}</text>'
        )
    svg = (
        f'<svg class="chart" viewBox="0 0 {label_w + plot_w + 150} {h}" width="100%" role="img">'
        f"{''.join(parts)}</svg>"
    )
    return Block(f"<section><h2>{esc(title)}</h2>{svg}</section>")
