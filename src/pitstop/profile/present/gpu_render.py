"""Terminal lines and HTML blocks for the device sections of a profile report: host vs device time per
phase with the idle's causes, MFU, and the ``--trace`` kernel analysis. Built only from
``Report.sections``, so a saved JSON report renders the same."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.text import Text

from pitstop.findings import Report
from pitstop.report.html import Block, table


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:.1f}"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.0f}%"


def device_rows(dev: dict[str, Any]) -> list[list[str]]:
    rows = [
        [phase, _ms(dev.get(f"host_{phase}_s")), _ms(dev.get(f"device_{phase}_s"))]
        for phase in ("forward", "backward", "optimizer")
    ]
    rows.append(["host syncs", _ms(dev.get("host_sync_s")), "-"])
    rows.append(["data wait", _ms(dev.get("host_data_wait_s")), "-"])
    return rows


def idle_line(dev: dict[str, Any]) -> str:
    causes = [
        ("data wait", dev.get("idle_data_s")),
        ("launch gaps", dev.get("idle_launch_s")),
        ("host syncs", dev.get("idle_sync_s")),
        ("other", dev.get("idle_other_s")),
    ]
    parts = ", ".join(f"{k} {_ms(v)} ms" for k, v in causes if v is not None)
    bound = "device-bound" if dev.get("device_bound") else "host-bound"
    return (
        f"GPU busy {_ms(dev['busy_s'])} ms, idle {_ms(dev['idle_s'])} ms of a {_ms(dev['wall_s'])} ms step "
        f"({bound}, CUDA events over {dev['steps']} steps); idle: {parts}"
    )


def mfu_line(m: dict[str, Any]) -> str:
    if m.get("mfu") is None:
        why = (
            m.get("skipped")
            or m.get("error")
            or ("inconsistent" in m and "over 100%: inconsistent")
            or "no peak"
        )
        return f"MFU: not measured ({why})"
    return (
        f"MFU {100 * m['mfu']:.1f}%: {m['flops_per_step'] / 1e9:.2f} GFLOP/step at "
        f"{m['achieved_flops_per_s'] / 1e12:.3f} TFLOP/s, {m['dtype']} matmul peak "
        f"{m['peak_flops_per_s'] / 1e12:.3f} TFLOP/s (measured on this {m.get('device')})"
    )


def trace_lines(analysis: dict[str, Any]) -> list[str]:
    out = []
    for row in analysis.get("devices") or []:
        if row.get("stream") is None:
            out.append(
                f"trace, device {row['device']}: kernels {_pct(row['kernel_share'])}, memcpy "
                f"{_pct(row['memcpy_share'])}, memset {_pct(row['memset_share'])}, communication "
                f"{_pct(row['comm_share'])}, idle {_pct(row['idle_share'])}"
            )
    cpu = analysis.get("cpu") or {}
    if cpu and not analysis.get("devices"):
        out.append(
            f"trace, host thread: in ops {_pct(cpu['op_share'])}, outside ops {_pct(cpu['idle_share'])}"
        )
    return out


def print_gpu(report: Report, console: Console | None = None) -> None:
    """The device lines under the step breakdown (nothing when none was measured)."""
    s = report.sections
    console = console or Console()
    lines = []
    if dev := s.get("device_time"):
        lines.append(
            "device vs host ms: " + ", ".join(f"{r[0]} {r[2]} vs {r[1]}" for r in device_rows(dev)[:3])
        )
        lines.append(idle_line(dev))
    if m := s.get("mfu"):
        lines.append(mfu_line(m))
    lines += trace_lines((s.get("trace") or {}).get("analysis") or {})
    for line in lines:
        console.print(Text(line))


def html_blocks(report: Report) -> list[Block]:
    s = report.sections
    blocks: list[Block] = []
    if dev := s.get("device_time"):
        blocks.append(
            table(
                f"Host vs device time per step (ms). {idle_line(dev)}",
                ["phase", "host", "device"],
                device_rows(dev),
            )
        )
    if m := s.get("mfu"):
        keys = ["flops_per_step", "peak", "dtype", "mfu"]
        blocks.append(table(mfu_line(m), keys, [[m.get(k) for k in keys]]))
    analysis = (s.get("trace") or {}).get("analysis") or {}
    if analysis.get("devices"):
        cols = ["device", "stream", "kernel", "memcpy", "memset", "comm", "idle"]
        rows = [
            [r["device"], "all" if r["stream"] is None else r["stream"]]
            + [_pct(r[f"{k}_share"]) for k in ("kernel", "memcpy", "memset", "comm", "idle")]
            for r in analysis["devices"]
        ]
        blocks.append(table("Device time by kind (torch.profiler trace)", cols, rows))
    if analysis.get("top_kernels"):
        blocks.append(
            table(
                "Top kernels by device time (torch.profiler trace)",
                ["kernel", "calls", "total ms", "mean us", "share"],
                [
                    [r["name"], r["calls"], r["total_us"] / 1000, r["mean_us"], _pct(r["share"])]
                    for r in analysis["top_kernels"]
                ],
            )
        )
    cpu = analysis.get("cpu") or {}
    if cpu.get("top_ops"):
        blocks.append(
            table(
                f"Host thread: in ops {_pct(cpu['op_share'])} of the traced time; top ops by self time",
                ["op", "calls", "self ms", "share"],
                [[r["name"], r["calls"], r["self_us"] / 1000, _pct(r["share"])] for r in cpu["top_ops"]],
            )
        )
    return blocks
