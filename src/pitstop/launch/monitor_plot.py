"""`pitstop monitor --plot FILE.csv`: draw a CSV written by `--csv` as a PNG (matplotlib, Agg)."""

from __future__ import annotations

import csv
import os
from pathlib import Path


class PlotError(ValueError):
    pass


def read_csv(path: str | os.PathLike[str]) -> dict[str, list[float | None]]:
    try:
        with open(path, newline="") as fh:
            rows = list(csv.reader(fh))
    except OSError as e:
        raise PlotError(f"cannot read {path}: {e}") from None
    if len(rows) < 2 or "time_s" not in rows[0]:
        raise PlotError(f"{path} is not a `pitstop monitor --csv` file (no time_s column or no rows)")
    header = rows[0]
    cols: dict[str, list[float | None]] = {h: [] for h in header}
    for r in rows[1:]:
        for h, v in zip(header, r, strict=False):
            try:
                cols[h].append(float(v) if v != "" else None)
            except ValueError:
                cols[h].append(None)
    return cols


def plot_csv(path: str | os.PathLike[str], out: str | os.PathLike[str] | None = None) -> Path:
    from pitstop.plotting import matplotlib_agg

    matplotlib_agg()
    import matplotlib.pyplot as plt

    cols = read_csv(path)
    t = cols["time_s"]
    gpus = sorted({c.split("_", 1)[0] for c in cols if c.startswith("gpu") and c.endswith("_util_pct")})
    panels: list[tuple[str, list[str]]] = []
    if gpus:
        panels.append(("GPU utilization %", [f"{g}_util_pct" for g in gpus]))
        panels.append(("GPU memory GiB", [f"{g}_mem_used_gib" for g in gpus]))
        panels.append(("GPU power W", [f"{g}_power_w" for g in gpus]))
    panels += [
        ("CPU %", ["cpu_pct", "proc_cpu_pct"]),
        ("RAM GiB", ["ram_used_gib"]),
        ("disk MB/s", ["disk_read_mb_s", "disk_write_mb_s", "proc_read_mb_s", "proc_write_mb_s"]),
        ("network MB/s", ["net_recv_mb_s", "net_sent_mb_s"]),
    ]
    panels = [
        (title, [c for c in names if c in cols and any(v is not None for v in cols[c])])
        for title, names in panels
    ]
    panels = [p for p in panels if p[1]]
    fig, axes = plt.subplots(len(panels), 1, figsize=(10, 2.2 * len(panels)), sharex=True, squeeze=False)
    for ax, (title, names) in zip(axes[:, 0], panels, strict=True):
        for name in names:
            pts = [(x, y) for x, y in zip(t, cols[name], strict=False) if x is not None and y is not None]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], label=name, linewidth=1.2)
        ax.set_ylabel(title, fontsize=8)
        # percentages on a fixed 0-100 scale, amounts from zero: flat lines must not look like swings
        if title.endswith("%"):  # a process tree's CPU % goes past 100 on several cores
            top = max((v for n in names for v in cols[n] if v is not None), default=100.0)
            ax.set_ylim(0, max(105.0, top * 1.05))
        else:
            ax.set_ylim(bottom=0)
        ax.legend(loc="upper right", fontsize=7)
        ax.grid(alpha=0.3)
    axes[-1, 0].set_xlabel("seconds")
    fig.suptitle(f"pitstop monitor: {Path(path).name}")
    fig.tight_layout()
    dest = Path(out) if out else Path(path).with_suffix(".png")
    fig.savefig(dest, dpi=100)
    plt.close(fig)
    return dest
