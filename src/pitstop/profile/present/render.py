"""Profile-specific views of a Report: the step breakdown (terminal bar, HTML chart) and the timeline.

Built only from ``Report.sections`` (what was measured), so a saved JSON report renders the same.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.text import Text

from pitstop.findings import Report
from pitstop.profile.analyze.headline import costed, headline
from pitstop.profile.present import gpu_render
from pitstop.profile.present.render_stacks import stacks_blocks
from pitstop.profile.present.render_views import step_timeline, what_if
from pitstop.profile.record.timeline import PART_LABELS, PARTS
from pitstop.report.html import PALETTE, Block, bar_chart, esc, line_chart, stacked_bar, table
from pitstop.units import duration, sig3

_RICH_COLORS = ["blue", "dark_orange", "red", "cyan", "green", "yellow", "magenta"]


def breakdown_parts(report: Report) -> dict[str, float]:
    bd = report.sections.get("breakdown") or {}
    return {PART_LABELS[p]: float(bd.get(p, 0.0)) for p in PARTS}


def _glance_blocks(report: Report) -> list[Block]:
    """The headline (a lead block), a hang's or stall's stacks, the findings' costs largest first, what
    if each were fixed, the mean step's parts, the step timeline, per-step and loss charts."""
    s = report.sections
    lines = headline(report)
    blocks: list[Block] = []
    if lines:
        html = "".join(
            f"<p class='headline'>{'<b>' if i == 0 else ''}{esc(t)}{'</b>' if i == 0 else ''}</p>"
            for i, t in enumerate(lines)
        )
        blocks.append(Block(f"<section id='headline'>{html}</section>", lead=True))
    blocks += stacks_blocks(report)  # a hang's or a stall's stacks, first
    found = costed(report)
    if found:
        blocks.append(
            bar_chart(
                "What each finding costs per step, largest first (measured in this run, mean per step)",
                [f.id for f in found],
                [f.est_saving_s or 0.0 for f in found],
                unit="s",
            )
        )
    what = what_if(report)
    if what is not None:
        blocks.append(what)
    bd = s.get("breakdown")
    if bd:
        blocks.append(
            stacked_bar(
                f"Where a step goes: the mean of {bd['steps']} measured steps, {duration(bd['mean_step_s'])} "
                "(the parts add up to the mean)",
                breakdown_parts(report),
                unit="s",
            )
        )
    track = step_timeline(report)
    if track is not None:
        blocks.append(track)
    steps = list(s.get("steps", []))
    if steps:
        x = [float(st["index"]) for st in steps]
        warm = [float(st["index"]) for st in steps if st.get("warmup")]
        blocks.append(
            line_chart(
                "Per-step time (ms; warm-up steps shaded, left out of every mean)",
                x,
                {
                    "total": [st["total_s"] * 1000 for st in steps],
                    "data wait": [st["data_wait_s"] * 1000 for st in steps],
                    "forward+backward": [(st["forward_s"] + st["backward_s"]) * 1000 for st in steps],
                    "optimizer": [st["optimizer_s"] * 1000 for st in steps],
                    "host syncs": [st["sync_s"] * 1000 for st in steps],
                },
                xlabel="step",
                ylabel="ms",
                shade=(min(warm) - 0.5, max(warm) + 0.5, "warm-up") if warm else None,
            )
        )
    losses = [v for v in s.get("losses", []) if v is not None]
    if len(losses) > 1:
        measured = [float(st["index"]) for st in steps if not st.get("warmup")]
        x = measured if len(measured) == len(losses) else [float(i) for i in range(len(losses))]
        blocks.append(
            line_chart(
                "Loss per measured step (axis spans the losses, not from 0)",
                x,
                {"loss": losses},
                "step",
                "loss",
                zero=False,
            )
        )
    return blocks


def html_blocks(report: Report) -> list[Block]:
    s = report.sections
    blocks = _glance_blocks(report)  # headline, costs, what-if, the step: what a reader looks at first
    if s.get("ranks"):  # a torchrun / accelerate launch: per-rank views
        from pitstop.profile.present.render_ranks import rank_blocks

        blocks += rank_blocks(report)
    if s.get("loaders"):
        blocks.append(
            table(
                "DataLoaders as constructed",
                ["where", "workers", "batch", "pin_memory", "persistent", "prefetch", "dataset", "wait"],
                [
                    [
                        ld.get("location"),
                        ld.get("num_workers"),
                        ld.get("batch_size"),
                        ld.get("pin_memory"),
                        ld.get("persistent_workers"),
                        ld.get("prefetch_factor"),
                        f"{ld.get('dataset_type')} ({ld.get('dataset_len')})",
                        duration(ld["wait_s"]) if isinstance(ld.get("wait_s"), int | float) else None,
                    ]
                    for ld in s["loaders"]
                ],
            )
        )
    if s.get("sync_sites"):
        blocks.append(
            table(
                "Host syncs by place",
                ["where", "call", "count", "time"],
                [
                    [
                        x.get("location"),
                        "." + str(x.get("method", "")).strip("_") + "()",
                        x.get("count"),
                        duration(x["time_s"]) if isinstance(x.get("time_s"), int | float) else None,
                    ]
                    for x in sorted(s["sync_sites"], key=lambda x: -x.get("time_s", 0))[:20]
                ],
            )
        )
    models = s.get("models") or []
    if models:
        keys = [
            "type",
            "params",
            "param_dtypes",
            "device",
            "autocast",
            "conv2d_layers",
            "channels_last",
            "compiled",
        ]
        blocks.append(table("Models", keys, [[_cell(m.get(k)) for k in keys] for m in models]))
    top = (s.get("trace") or {}).get("top_ops") or []
    if top:
        blocks.append(
            table(
                "Top operators by self time (torch.profiler)",
                ["operator", "calls", "self CPU ms", "self device ms"],
                [[r["name"], r["calls"], r["self_cpu_ms"], r["self_device_ms"]] for r in top],
            )
        )
    blocks += gpu_render.html_blocks(report)  # host vs device time, MFU, kernel analysis
    return blocks


def _cell(v: Any) -> Any:
    return ", ".join(map(str, v)) if isinstance(v, list) else v


def print_breakdown(report: Report, console: Console | None = None) -> None:
    """A one-line bar of the step's parts, above the findings table."""
    bd = report.sections.get("breakdown")
    if not bd:
        return
    console = console or Console()
    parts = breakdown_parts(report)
    total = sum(parts.values()) or 1.0
    width = max(20, min(80, console.width - 10))
    bar = Text()
    items: list[Text] = []
    for i, (name, v) in enumerate(parts.items()):
        color = _RICH_COLORS[i % len(_RICH_COLORS)]
        n = round(width * v / total)
        bar.append("█" * n, style=color)
        if v / total >= 0.005:
            items.append(Text(f"■ {name} {duration(v)} ({100 * v / total:.0f}%)", style=color))
    legend = _pack(items, console.width)
    for i, line in enumerate(headline(report)):
        console.print(Text(line, style="bold" if i == 0 else ""))
    mean = bd["mean_step_s"]
    if bd.get("boundary"):
        console.print(Text(f"steps delimited by {bd['boundary']}", style="dim"))
    console.print(
        Text(
            f"mean step {duration(mean)} over {bd['steps']} measured steps ({sig3(1.0 / mean)} steps/s), "
            "split into its parts:",
            style="bold",
        )
    )
    console.print(bar)
    console.print(legend)
    gpu_render.print_gpu(report, console)  # device time, MFU, trace shares


def _pack(items: list[Text], width: int) -> Text:
    """Legend items on as few lines as fit, never one split across two."""
    out, used = Text(), 0
    for item in items:
        if used and used + 2 + item.cell_len > width:
            out.append("\n")
            used = 0
        elif used:
            out.append("  ")
            used += 2
        out.append_text(item)
        used += item.cell_len
    return out


assert len(PALETTE) >= len(PARTS)
