"""Two HTML views of a profile a performance engineer reads first, both from measured data only:

- the step timeline: one track per step, its phases laid end to end in loop order (data wait, copy,
  forward, backward, optimizer, host syncs, other), as a trace viewer draws them; warm-up steps marked.
  Each phase is the step's summed time in it (the per-step records keep sums, not every interval).
- what if: the mean step now and with each costed finding's fix applied, the step minus the finding's
  measured cost (its confirmed interval drawn where fresh runs gave one).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pitstop.findings import Report
from pitstop.profile.analyze.headline import confirmed, costed
from pitstop.profile.record.timeline import PART_LABELS, PARTS
from pitstop.report.html import PALETTE, Block, esc, ticks
from pitstop.units import duration, sig3

MAX_TRACKS = 80  # steps drawn in the timeline; a longer run shows its first ones and says so
W, L, R = 760, 130, 20  # svg width, label column, right margin


def _x_axis(
    top: float, vmax: float, label: str, left: int = L, right: int = R
) -> tuple[Callable[[float], float], str, float]:
    """A time axis from 0 at ``top``: the scale function, the svg of its ticks and labels, its span."""
    xt = ticks(0.0, vmax)
    span = xt[-1] or 1.0

    def px(v: float) -> float:
        return left + (W - left - right) * v / span

    marks = "".join(
        f'<line x1="{px(v):.1f}" y1="{top}" x2="{px(v):.1f}" y2="{top + 4}" stroke="#888"/>'
        f'<text class="xtick" x="{px(v):.1f}" y="{top + 16}" text-anchor="middle">{esc(duration(v))}</text>'
        for v in xt
    )
    axis = f'<line x1="{left}" y1="{top}" x2="{W - right}" y2="{top}" stroke="#888"/>{marks}'
    axis += f'<text x="{(W - right + left) / 2}" y="{top + 32}" text-anchor="middle">{esc(label)}</text>'
    return px, axis, span


def step_timeline(report: Report) -> Block | None:
    steps: list[dict[str, Any]] = list(report.sections.get("steps") or [])
    if not steps:
        return None
    shown = steps[:MAX_TRACKS]
    row = 16
    top = 6 + row * len(shown)
    px, axis, _ = _x_axis(top + 4, max(float(s.get("total_s") or 0.0) for s in shown), "time in the step")
    parts = [axis]
    for i, st in enumerate(shown):
        y = 6 + i * row
        warm = bool(st.get("warmup"))
        label = f"step {st.get('index')}" + (" (warm-up)" if warm else "")
        grey, faint = (' fill="#999"', ' opacity="0.45"') if warm else ("", "")
        parts.append(
            f'<text class="track" x="{L - 6}" y="{y + 11}" text-anchor="end"{grey}>{esc(label)}</text>'
        )
        t = 0.0
        for k, p in enumerate(PARTS):
            v = max(0.0, float(st.get(p) or 0.0))
            if v <= 0:
                continue
            parts.append(
                f'<rect class="phase" x="{px(t):.1f}" y="{y + 2}" width="{max(0.5, px(t + v) - px(t)):.1f}" '
                f'height="{row - 4}" fill="{PALETTE[k % len(PALETTE)]}"{faint}>'
                f"<title>step {esc(st.get('index'))}: {esc(PART_LABELS[p])} {esc(duration(v))}</title></rect>"
            )
            t += v
    legend = "".join(
        f'<span class="key"><i style="background:{PALETTE[k % len(PALETTE)]}"></i>{esc(PART_LABELS[p])}</span>'
        for k, p in enumerate(PARTS)
    )
    more = f" (the first {MAX_TRACKS} of {len(steps)})" if len(steps) > MAX_TRACKS else ""
    svg = f'<svg class="chart" viewBox="0 0 {W} {top + 42}" width="100%" role="img">{"".join(parts)}</svg>'
    return Block(
        f"<section id='step-timeline'><h2>Step timeline: each step's phases in loop order{esc(more)}</h2>"
        "<p class='note'>One track per step, as a trace viewer draws them; each phase is the step's "
        "summed time in it. Warm-up steps (greyed) are left out of every mean.</p>"
        f"{svg}<div class='legend'>{legend}</div></section>"
    )


def what_if(report: Report) -> Block | None:
    bd = report.sections.get("breakdown") or {}
    mean = float(bd.get("mean_step_s") or 0.0)
    found = costed(report)
    if mean <= 0 or not found:
        return None
    rows: list[tuple[str, float, tuple[float, float] | None, str]] = [("as measured", mean, None, "")]
    for f in found:
        ci = f.data.get("saving_ci_s") if isinstance(f.data, dict) else None
        band = None
        if isinstance(ci, list | tuple) and len(ci) == 2 and all(isinstance(v, int | float) for v in ci):
            band = (max(0.0, mean - float(ci[1])), max(0.0, mean - float(ci[0])))
        state = "confirmed" if confirmed(f) else "not confirmed"
        rows.append((f"{f.id} fixed", max(0.0, mean - float(f.est_saving_s or 0.0)), band, state))
    row = 26
    top = 6 + row * len(rows)
    vmax = max([mean] + [b[1] for _, _, b, _ in rows if b])
    left = 230  # finding ids are long; the values and states go right of the bars
    px, axis, _ = _x_axis(top + 4, vmax, "mean step", left, 190)
    parts = [axis]
    for i, (label, v, band, state) in enumerate(rows):
        y = 6 + i * row
        color = "#888" if i == 0 else PALETTE[(i - 1) % len(PALETTE)]
        text = f"{duration(v)} ({sig3(1 / v)} steps/s)" if v > 0 else duration(v)
        text += f"; {state}" if state else ""
        parts.append(
            f'<text x="{left - 6}" y="{y + 15}" text-anchor="end">{esc(label)}</text>'
            f'<rect class="whatif" x="{left}" y="{y + 4}" width="{px(v) - left:.1f}" height="{row - 10}" fill="{color}">'
            f"<title>{esc(label)}: {esc(text)}</title></rect>"
            f'<text x="{max(px(v), px(band[1]) if band else 0) + 6:.1f}" y="{y + 15}">{esc(text)}</text>'
        )
        if band:
            yc = y + row / 2 - 1
            parts.append(
                f'<line x1="{px(band[0]):.1f}" y1="{yc}" x2="{px(band[1]):.1f}" y2="{yc}" stroke="#222"/>'
                f'<line x1="{px(band[0]):.1f}" y1="{yc - 5}" x2="{px(band[0]):.1f}" y2="{yc + 5}" stroke="#222"/>'
                f'<line x1="{px(band[1]):.1f}" y1="{yc - 5}" x2="{px(band[1]):.1f}" y2="{yc + 5}" stroke="#222"/>'
            )
    svg = f'<svg class="chart" viewBox="0 0 {W} {top + 42}" width="100%" role="img">{"".join(parts)}</svg>'
    return Block(
        "<section id='what-if'><h2>What if: the mean step with each fix applied</h2>"
        "<p class='note'>The measured mean step minus each finding's measured cost per step (the whole of "
        "it removed); a whisker is the 95% interval of the saving that fresh runs with the fix measured.</p>"
        f"{svg}</section>"
    )
