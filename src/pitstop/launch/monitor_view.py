"""The live screen of `pitstop monitor`: one rich renderable per sample. Renders, never measures."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from pitstop.launch.monitor import Sample, Streak
from pitstop.units import GiB


def _bar(pct: float | None, width: int = 20) -> Text:
    if pct is None:
        return Text("n/a", style="dim")
    filled = max(0, min(width, round(width * pct / 100)))
    style = "red" if pct >= 90 else "yellow" if pct >= 70 else "green"
    return Text("█" * filled, style=style) + Text("░" * (width - filled), style="dim") + Text(f" {pct:5.1f}%")


def _num(v: float | None, fmt: str = "{:.1f}") -> str:
    return "n/a" if v is None else fmt.format(v)


def render(
    s: Sample,
    title: str,
    alerts: Sequence[Streak] = (),
    threshold: float = 70.0,
    gpu_note: str | None = None,
    output: Sequence[str] = (),
) -> RenderableType:
    parts: list[RenderableType] = [Text(title, style="bold")]
    if s.gpus:
        g = Table(title="GPUs (NVML)", expand=True, title_justify="left")
        for col in ("gpu", "util", "mem", "power W", "temp °C", "SM MHz", "mem MHz", "procs"):
            g.add_column(col, no_wrap=True)
        for x in s.gpus:
            mem = (
                "n/a"
                if x.mem_used_bytes is None or x.mem_total_bytes is None
                else f"{x.mem_used_bytes / GiB:.1f}/{x.mem_total_bytes / GiB:.1f} GiB"
            )
            g.add_row(
                str(x.index),
                _bar(x.util_gpu_pct),
                mem,
                _num(x.power_w, "{:.0f}"),
                _num(x.temperature_c, "{:.0f}"),
                _num(x.sm_clock_mhz, "{}"),
                _num(x.mem_clock_mhz, "{}"),
                "n/a" if x.processes is None else str(len(x.processes)),
            )
        parts.append(g)
    elif gpu_note:
        parts.append(Text(f"GPU: {gpu_note}", style="dim"))
    h = Table(title="Host (psutil)", expand=True, show_header=False, title_justify="left")
    h.add_column("what", style="bold", no_wrap=True)
    h.add_column("value")
    h.add_row("CPU all", _bar(s.cpu_pct))
    cores = Text()
    for i, p in enumerate(s.cpu_per_core):
        style = "red" if p >= 90 else "yellow" if p >= 50 else "green"
        cores += Text(f"{i}:", style="dim") + Text(f"{p:3.0f} ", style=style)
    h.add_row("per core %", cores)
    h.add_row("RAM", _bar(100 * s.ram_used_bytes / s.ram_total_bytes if s.ram_total_bytes else None))
    h.add_row(
        "",
        Text(
            f"{s.ram_used_bytes / GiB:.1f} / {s.ram_total_bytes / GiB:.1f} GiB, swap {s.swap_used_bytes / GiB:.1f} GiB"
        ),
    )
    h.add_row("disk MB/s", f"read {_num(s.disk_read_mb_s)}  write {_num(s.disk_write_mb_s)}")
    h.add_row("net MB/s", f"recv {_num(s.net_recv_mb_s)}  sent {_num(s.net_sent_mb_s)}")
    if s.proc_alive is not None:
        state = "running" if s.proc_alive else "exited"
        rss = "n/a" if s.proc_rss_bytes is None else f"{s.proc_rss_bytes / GiB:.2f} GiB"
        h.add_row("command", f"{state}, CPU {_num(s.proc_cpu_pct, '{:.0f}')}% (100 = 1 core), RSS {rss}")
        h.add_row("command I/O", f"read {_num(s.proc_read_mb_s)}  write {_num(s.proc_write_mb_s)} MB/s")
    parts.append(h)
    for st in alerts:
        parts.append(
            Panel(
                Text(
                    f"GPU {st.gpu} under {threshold:.0f}% for {st.seconds:.0f} s while training runs: the input "
                    "pipeline is likely the bottleneck. Run `pitstop profile -- python train.py ...` to see "
                    "where the step time goes."
                ),
                title="low GPU utilization",
                border_style="yellow",
            )
        )
    if output:
        parts.append(Panel(Text("\n".join(output)), title="command output", border_style="dim"))
    return Group(*parts)
