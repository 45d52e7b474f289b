"""Single instance vs bound multi-instance CPU inference throughput, side by side in one run.

Same total work (ResNet-18, batches of 8 images at 96x96, inference mode) done three ways on the cores
this process may use, started by pitstop's launcher (`pitstop.launch.launcher`, the code behind
`pitstop launch`):

  1 instance x all cores     one process, OMP threads = cores, bound to them
  N instances x 1 core       N processes, each 1 thread bound to its own core  (--ninstances N)
  N instances unbound        the same N single-thread processes with no binding (--bind none)

Throughput = images / (last instance's end - first instance's start), so skew between instances
counts against the multi-instance rows. Configurations are interleaved per repeat; we report min and
median over repeats. Writes benchmarks/results/launch_instances.md.

    flock /tmp/pitstop-bench.lock .venv/bin/python benchmarks/launch_instances.py [--repeats 3] [--batches 40]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results" / "launch_instances.md"


def worker(out_dir: str, batches: int, batch: int, size: int) -> None:
    """One instance: warm up, then time `batches` forward passes and write start/end to a JSON file."""
    import torch
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10).eval()
    x = torch.randn(batch, 3, size, size)
    with torch.inference_mode():
        for _ in range(2):
            model(x)
        start, cpu0 = time.time(), time.process_time()
        for _ in range(batches):
            model(x)
        end, cpu = time.time(), time.process_time() - cpu0
    i = os.environ.get("PITSTOP_INSTANCE", "0")
    Path(out_dir, f"w{i}.json").write_text(
        json.dumps(
            {
                "start": start,
                "end": end,
                "cpu_s": cpu,
                "images": batches * batch,
                "threads": torch.get_num_threads(),
                "cpus": sorted(os.sched_getaffinity(0)),
            }
        )
    )


def run_config(ninstances: int, bind: str, cpus: list[int], batches: int, args: argparse.Namespace) -> dict:
    from pitstop.host.topology import format_cpulist, numactl_path, read_topology
    from pitstop.launch.launcher import LaunchOptions, Tools, build_plan, run_plan

    with tempfile.TemporaryDirectory() as out:
        opts = LaunchOptions(
            command=[
                __file__,
                "--worker",
                out,
                "--batches",
                str(batches),
                "--batch",
                str(args.batch),
                "--size",
                str(args.size),
            ],
            ninstances=ninstances,
            core_list=format_cpulist(cpus),
            use_logical_cores=True,
            bind=bind,
        )
        plan = build_plan(
            opts, read_topology(), os.environ, Tools(numactl_path(), shutil.which("taskset")), cpus
        )
        rc = run_plan(plan)
        if rc != 0:
            raise SystemExit(f"instance failed with exit code {rc}")
        ws = [json.loads(p.read_text()) for p in sorted(Path(out).glob("w*.json"))]
    images = sum(w["images"] for w in ws)
    wall = max(w["end"] for w in ws) - min(w["start"] for w in ws)
    return {
        "images_per_s": images / wall,
        "images_per_cpu_s": images / sum(w["cpu_s"] for w in ws),
        "wall_s": wall,
        "threads": [w["threads"] for w in ws],
        "cpus": [w["cpus"] for w in ws],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", metavar="OUT_DIR", help=argparse.SUPPRESS)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batches", type=int, default=40, help="total batches per configuration")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--size", type=int, default=96)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker, args.batches, args.batch, args.size)
        return
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    from rich.console import Console
    from rich.progress import Progress

    from pitstop.host.load import load_average, load_line
    from pitstop.host.machine import machine_line

    cpus = sorted(os.sched_getaffinity(0))
    n = len(cpus)
    if n < 2:
        raise SystemExit("needs at least 2 usable CPUs")
    configs = [
        (f"1 instance x {n} threads (bound)", 1, "auto"),
        (f"{n} instances x 1 thread (bound)", n, "auto"),
        (f"{n} instances x 1 thread (unbound)", n, "none"),
    ]
    per_instance = max(1, args.batches // n)
    load0 = load_average()
    results: dict[str, list[dict]] = {c[0]: [] for c in configs}
    console = Console(stderr=True)
    try:
        with Progress(console=console) as prog:
            task = prog.add_task("measuring", total=args.repeats * len(configs))
            for _ in range(args.repeats):
                for name, k, bind in configs:  # interleaved: each repeat runs every configuration once
                    results[name].append(
                        run_config(k, bind, cpus, args.batches if k == 1 else per_instance, args)
                    )
                    prog.advance(task)
    except KeyboardInterrupt:
        console.print("interrupted: reporting the repeats measured so far")
    base = (
        statistics.median(r["images_per_s"] for r in results[configs[0][0]])
        if results[configs[0][0]]
        else None
    )
    rows = []
    for name, _, _ in configs:
        xs = [r["images_per_s"] for r in results[name]]
        if not xs:
            continue
        med = statistics.median(xs)
        ratio = f"{med / base:.2f}x" if base else "-"
        eff = statistics.median(r["images_per_cpu_s"] for r in results[name])
        rows.append(
            f"| {name} | {min(xs):.1f} | {med:.1f} | {max(xs):.1f} | {ratio} | {eff:.1f} | {len(xs)} |"
        )
    cmd = "flock /tmp/pitstop-bench.lock .venv/bin/python benchmarks/launch_instances.py " + " ".join(
        sys.argv[1:]
    )
    text = "\n".join(
        [
            "# launch: single instance vs bound multi-instance CPU inference",
            "",
            f"- machine: {machine_line()}",
            f"- date: {dt.datetime.now(dt.UTC).isoformat(timespec='seconds')}",
            f"- command: `{cmd.strip()}`",
            f"- workload: ResNet-18 inference, batch {args.batch}, {args.size}x{args.size}, {args.batches} batches "
            f"in total per configuration, started with pitstop's launcher; throughput = images / (last end - "
            "first start) over all instances, configurations interleaved per repeat",
            f"- {load_line(load0)}: a multi-threaded process suffers most when other work takes its cores "
            "(OpenMP threads wait for the descheduled one), so the single-instance row gains most on an idle "
            "machine. Images per CPU-second is less sensitive to that load.",
            "",
            "| configuration | min images/s | median images/s | max images/s | median vs 1 instance "
            "| median images per CPU-second | repeats |",
            "| --- | --- | --- | --- | --- | --- | --- |",
            *rows,
            "",
        ]
    )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
