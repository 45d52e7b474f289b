"""Checks for `benchmarks/gpu_check.sh`: device timing from pitstop's CUDA events against torch.profiler.

    python benchmarks/gpu_check.py compare OUT_DIR...        # one markdown row per profiled example
    python benchmarks/gpu_check.py summary RESULTS.md ...    # the gpu_check.md header (machine, load, mode)

For each ``pitstop profile --trace --out-dir OUT_DIR`` run: the traced steps (the three active steps of
the profiler window) are looked up in ``measurements.json``; pitstop's events give the device span of
those steps (first step's forward start to last step's optimizer end, as the device ran them) and the device time of
forward+backward+optimizer; the Chrome trace gives the span from the first to the last device activity
and the union of kernel/memcpy/memset time. The span is the check (within 10%): both clocks see the
same device run the same work. Busy vs the events' compute time is reported beside it: they agree only
when the device is the bottleneck (events count launch gaps inside a phase as phase time).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

TOLERANCE = 0.10


def compare(out_dir: Path) -> dict[str, Any]:
    from pitstop.profile.capture import trace_analysis as ta

    meas = json.loads((out_dir / "measurements.json").read_text())
    row: dict[str, Any] = {
        "run": out_dir.name,
        "device": meas.get("device") or "cpu",
        "status": meas.get("status"),
    }
    dev = meas.get("device_time") or {}
    traced = [r["index"] for r in meas.get("steps", []) if r.get("traced")][
        1:
    ]  # after the profiler's warm-up
    by_index = {d["index"]: d for d in dev.get("steps") or []}
    trace_path = out_dir / "trace.json"
    if not row["device"].startswith("cuda"):
        return {**row, "verdict": "not checked: no CUDA device in this run"}
    if not traced or not all(i in by_index for i in traced) or not trace_path.exists():
        return {**row, "verdict": f"not checked: events for traced steps {traced} or the trace missing"}
    steps = [by_index[i] for i in traced]
    # from the first step's forward start to the last step's optimizer end, as the device ran them: the
    # data wait before the first forward and the host work after the last optimizer step hold no kernels
    events_span = (
        sum(s["span_s"] for s in steps) - steps[0]["data_s"] - steps[0]["pre_s"] - steps[-1]["post_s"]
    )
    events_compute = sum(s["compute_s"] for s in steps)
    trace = ta.load(trace_path)
    acts = trace.on_device()
    if not acts:
        return {**row, "verdict": "not checked: no device activity in the trace"}
    trace_span = (max(e.end for e in acts) - min(e.ts for e in acts)) / 1e6
    trace_busy = ta.length(ta.union([(e.ts, e.end) for e in acts])) / 1e6
    err = abs(events_span - trace_span) / trace_span if trace_span > 0 else float("inf")
    return {
        **row,
        "steps": len(steps),
        "events_span_s": events_span,
        "trace_span_s": trace_span,
        "span_error": err,
        "events_compute_s": events_compute,
        "trace_busy_s": trace_busy,
        "verdict": "pass" if err <= TOLERANCE else f"FAIL (> {TOLERANCE:.0%})",
    }


def _ms(v: Any) -> str:
    return f"{v * 1000:.2f}" if isinstance(v, float) else "-"


def table(rows: list[dict[str, Any]]) -> list[str]:
    out = [
        "| run | device | traced steps | events: device span ms | trace: device span ms | span error | "
        "events: fwd+bwd+opt ms | trace: device busy ms | verdict |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        err = f"{100 * r['span_error']:.1f}%" if "span_error" in r else "-"
        out.append(
            f"| {r['run']} | {r['device']} | {r.get('steps', '-')} | {_ms(r.get('events_span_s'))} | "
            f"{_ms(r.get('trace_span_s'))} | {err} | {_ms(r.get('events_compute_s'))} | "
            f"{_ms(r.get('trace_busy_s'))} | {r['verdict']} |"
        )
    return out


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    if argv[0] == "compare":
        rows = [compare(Path(p)) for p in argv[1:] if (Path(p) / "measurements.json").exists()]
        missing = [p for p in argv[1:] if not (Path(p) / "measurements.json").exists()]
        print("\n".join(table(rows)))
        for p in missing:
            print(f"\n- {Path(p).name}: no measurements (the profile run failed; see its log)")
        return 1 if any(r["verdict"].startswith("FAIL") for r in rows) else 0
    if argv[0] == "summary":
        from pitstop.host.load import load_average, load_line
        from pitstop.host.machine import machine_line

        dry = "--dry-run" in argv
        print("# GPU check" + (" (DRY RUN on CPU: no GPU figure)" if dry else ""))
        print()
        print(f"- machine: {machine_line()}")
        print(f"- {load_line(load_average())}")
        if dry:
            print(
                "- mode: --dry-run, CUDA hidden (CUDA_VISIBLE_DEVICES=''), tiny sizes: this shows the script runs "
                "end to end; none of its numbers is a GPU figure"
            )
        return 0
    print(f"unknown command {argv[0]!r}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
