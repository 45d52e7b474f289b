"""`pitstop compress report` on the digits models and on torchvision ResNet-18, side by side in one run.

Every row is measured by `pitstop.compress.compress_report` in this run: saved size (torch.save of the
state_dict), forward latency at batch 1 and batch N (torch.utils.benchmark blocked_autorange; all models
of one workload timed round-robin over --rounds rounds, median and min over the pooled block times),
top-1 accuracy on the digits test split (397 images), and the fraction of weights that are exactly zero.

  digits MLP (64-256-256-10)  dynamic int8, static int8, torchao int8 weight-only, 50% global pruning
                              and 30% channel pruning (each fine-tuned 100 steps)
  digits CNN (2 convs + fc)   the same without weight-only (no Linear worth it)
  distillation                a 2.4k-parameter student trained 300 steps on 50 labels, with and without
                              the MLP teacher (T=4, alpha=0.9)
  ResNet-18 (random init)     latency and size only (random weights: accuracy means nothing), 224x224,
                              batch N = 8; pruning without fine-tune

Writes benchmarks/results/compress_report.md.

    flock /tmp/pitstop-bench.lock .venv/bin/python benchmarks/compress_report.py [--no-resnet] [--rounds 5] [--threads 1]
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results" / "compress_report.md"


def run_all(args: argparse.Namespace) -> list[tuple[str, str, Any]]:
    import torch

    from pitstop.compress import ReportOptions, compress_report, digits

    common = {
        "min_run_time": args.min_run_time,
        "latency_rounds": args.rounds,
        "threads": args.threads or None,
    }
    out = []

    def progress(name: str, done: int, total: int) -> None:
        print(f"  [{done}/{total}] {name}", file=sys.stderr, flush=True)

    print("digits MLP", file=sys.stderr)
    mlp = digits.trained_mlp()
    methods = ("dynamic_int8", "static_int8", "int8_weight_only", "prune_global", "prune_structured")
    rep = compress_report(
        mlp,
        digits.test_loader(),
        ReportOptions(methods=methods, **common),
        digits.train_loader(),
        progress=progress,
    )
    out.append(("digits MLP (85k params), batch N = 64", "", rep))

    print("digits CNN", file=sys.stderr)
    methods = ("dynamic_int8", "static_int8", "prune_global", "prune_structured")
    rep = compress_report(
        digits.trained_cnn(),
        digits.test_loader(),
        ReportOptions(methods=methods, **common),
        digits.train_loader(),
        progress=progress,
    )
    out.append(("digits CNN (6k params), batch N = 64", "", rep))

    print("distillation", file=sys.stderr)
    opts = ReportOptions(methods=("student", "distill"), distill_steps=300, lr=1e-2, **common)
    rep = compress_report(
        mlp,
        digits.test_loader(),
        opts,
        digits.few_label_loader(),
        student=digits.student_mlp,
        progress=progress,
    )
    out.append(("distillation: MLP teacher -> 2.4k-param student, 300 steps on 50 labelled rows", "", rep))

    if not args.no_resnet:
        import torchvision

        print("ResNet-18", file=sys.stderr)
        torch.manual_seed(0)
        model = torchvision.models.resnet18().eval()
        g = torch.Generator().manual_seed(0)
        images = [torch.randn(8, 3, 224, 224, generator=g) for _ in range(2)]  # inputs only: no accuracy
        methods = ("dynamic_int8", "static_int8", "prune_global", "prune_structured")
        opts = ReportOptions(methods=methods, calib_batches=2, **common)
        rep = compress_report(model, images, opts, progress=progress)
        out.append(("ResNet-18, random init, 224x224, batch N = 8 (latency and size only)", "", rep))
    return out


def _f(v: float | None, scale: float, digits: int = 2) -> str:
    return "–" if v is None else f"{v * scale:.{digits}f}"


def table(rep: Any) -> list[str]:
    rows = rep.sections["compress"]["rows"]
    base = next(r for r in rows if r["method"] == "baseline")
    lines = [
        "| method | library | saved KB | smaller | gzip KB | batch 1 ms median (min) | vs base median (min) | "
        "batch N ms median (min) | vs base median (min) | accuracy % | weights zero % |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        if r["error"] or not r["applicable"]:
            why = r["error"] or f"not applicable: {r['reason']}"
            lines.append(f"| {r['method']} | {why} |" + " – |" * 9)
            continue
        mins = r["extra"].get("latency_min_s", {})

        def ratio(key: str, r: dict[str, Any] = r) -> str:
            return f"{base[key] / r[key]:.2f}x" if base.get(key) and r.get(key) else "–"

        def ratios(key: str, batch: str, r: dict[str, Any] = r) -> str:
            bmin = base["extra"].get("latency_min_s", {}).get(batch)
            rmin = r["extra"].get("latency_min_s", {}).get(batch)
            by_min = f" ({bmin / rmin:.2f}x)" if bmin and rmin else ""
            return ratio(key) + by_min

        lines.append(
            f"| {r['method']} | {r['library']} | {_f(r['size_bytes'], 1e-3, 1)} | {ratio('size_bytes')} | "
            f"{_f(r['gzip_bytes'], 1e-3, 1)} | {_f(r['latency_b1_s'], 1e3, 3)} ({_f(mins.get('batch_1'), 1e3, 3)}) | "
            f"{ratios('latency_b1_s', 'batch_1')} | {_f(r['latency_bn_s'], 1e3, 3)} ({_f(mins.get('batch_n'), 1e3, 3)}) | "
            f"{ratios('latency_bn_s', 'batch_n')} | {_f(r['accuracy'], 100, 1)} | {_f(r['weight_sparsity'], 100, 1)} |"
        )
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--no-resnet", action="store_true", help="skip ResNet-18 (the slowest part)")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved latency rounds (default 5)")
    ap.add_argument("--min-run-time", type=float, default=1.0, help="timing seconds per model and batch size")
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads while timing (default 1: on a busy machine a descheduled OpenMP thread stalls "
        "the others, so multi-thread timings there are mostly noise; 0 = torch's default)",
    )
    args = ap.parse_args()

    import torch

    from pitstop.host.load import load_average, load_line
    from pitstop.host.machine import machine_line

    load0 = load_average()
    started = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    t0 = time.perf_counter()
    results = run_all(args)
    took = time.perf_counter() - t0
    cmd = "flock /tmp/pitstop-bench.lock .venv/bin/python benchmarks/compress_report.py" + (
        " " + " ".join(sys.argv[1:]) if sys.argv[1:] else ""
    )
    md = [
        "# compress: quantization, pruning and distillation, measured",
        "",
        f"- machine: {machine_line()}",
        f"- date: {started}; the whole run took {took:.0f} s",
        f"- command: `{cmd}`",
        f"- latency: torch.utils.benchmark blocked_autorange, {args.threads or torch.get_num_threads()} thread(s), no_grad; all "
        f"models of one table timed round-robin over {args.rounds} rounds ({args.min_run_time:g} s per model "
        "and batch size in all); median and (min) over the pooled block times. 'vs base' = baseline / method "
        "(above 1 = smaller or faster)",
        "- size: torch.save(state_dict) on disk; static int8 = the converted graph with int8 weights (the "
        "running model holds oneDNN-packed weights that torch.save cannot write)",
        "- accuracy: top-1 on the digits test split (397 images, never trained on)",
        f"- {load_line(load0)}: medians can carry load spikes that the mins do not; latency ratios within "
        "~20% are noise",
        "",
    ]
    for title, _, rep in results:
        md += [f"## {title}", "", *table(rep), ""]
        for f in rep.ranked():
            if f.severity in ("pass", "warn", "info") and f.id != "compress.baseline":
                md.append(f"- {f.severity.upper()} `{f.id}`: {f.title}")
        md.append("")
    text = "\n".join(md)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(text)
    print(text)
    print(f"\nwrote {RESULTS}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
