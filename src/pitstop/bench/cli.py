"""`pitstop bench`: the tuning guides' claims, measured on this machine."""

from __future__ import annotations

import argparse
import re

from pitstop.cliutil import add_output_args, comma_list, finish, progress_bar, shows_tables, usage_error

UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_budget(text: str) -> float:
    """'5m', '90s', '1.5h', '300' -> seconds."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*", text)
    if not m or float(m.group(1)) <= 0:
        raise ValueError(f"bad --budget {text!r}: use e.g. 5m, 90s, 300")
    return float(m.group(1)) * UNITS[m.group(2)]


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "bench",
        help="measure the tuning guides' claims (AMP, workers, checkpointing, compile, DDP ...) on this machine",
        description="Ablation benchmark: baseline, each optimization alone and all together, plus Lightning, "
        "Accelerate, OneCycle vs StepLR and DDP 1 vs N processes. Every number is measured in this run.",
    )
    p.add_argument("--workload", choices=("vision", "language", "tabular"), default="vision")
    p.add_argument("--size", choices=("tiny", "small", "medium", "large"), default="small")
    p.add_argument(
        "--model", metavar="PKG.MOD:FACTORY", help="your own model (a factory returning an nn.Module)"
    )
    p.add_argument("--batch-size", type=int, help="override the size preset's batch size")
    p.add_argument("--budget", default="5m", help="time budget; steps are scaled to fit (default 5m)")
    p.add_argument("--repeats", type=int, default=3, help="interleaved timed blocks per config (default 3)")
    p.add_argument("--warmup", type=int, default=2, help="warm-up steps per config (default 2)")
    p.add_argument("--steps", type=int, help="steps per timed block (default: scaled to the budget)")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--threads", type=int, help="torch threads (default: torch's choice)")
    p.add_argument("--workers", type=int, default=2, help="num_workers for the workers row (default 2)")
    p.add_argument("--only", help="comma-separated configs to run (the baseline always runs)")
    p.add_argument("--skip", help="comma-separated configs to leave out")
    p.add_argument("--no-peers", action="store_true", help="leave out the Lightning and Accelerate rows")
    p.add_argument("--no-compile", action="store_true", help="leave out the torch.compile rows")
    p.add_argument("--no-schedules", action="store_true", help="leave out OneCycle vs StepLR")
    p.add_argument("--ddp", type=int, metavar="N", help="DDP processes (default 2 on CPU, all GPUs; 0: none)")
    p.add_argument("--data-dir", help="where to write the generated JPEG folder (default: a temp dir)")
    p.add_argument("--png", metavar="FILE", help="write a PNG chart of speed-ups and memory ratios")
    p.add_argument("--markdown", metavar="FILE", help="write the table as Markdown")
    add_output_args(p)
    p.set_defaults(func=cmd_bench)


def cmd_bench(args: argparse.Namespace) -> int:
    try:
        budget = parse_budget(args.budget)
    except ValueError as e:
        return usage_error(str(e))
    for flag in ("repeats", "warmup", "steps", "threads", "batch_size"):
        v = getattr(args, flag)
        if v is not None and v < 1:
            return usage_error(f"--{flag.replace('_', '-')} must be at least 1")
    if args.workers < 1:
        return usage_error("--workers must be at least 1")

    import torch
    from rich.console import Console

    from pitstop.bench.configs import CLAIMS
    from pitstop.bench.results import html_blocks, markdown, print_table, to_report, write_png
    from pitstop.bench.runner import BenchOptions, run_bench
    from pitstop.factory import FactoryError
    from pitstop.plotting import unavailable

    if args.png and (missing := unavailable("--png")):
        return usage_error(missing)
    known = set(CLAIMS) | {"baseline", "all_compiled"}
    unknown = [n for n in comma_list(args.only) + comma_list(args.skip) if n not in known]
    if unknown:
        return usage_error(f"unknown config(s) {', '.join(unknown)}; choose from {', '.join(sorted(known))}")
    if args.device == "cuda" and not torch.cuda.is_available():
        return usage_error("--device cuda: torch sees no CUDA device here")
    opts = BenchOptions(
        workload=args.workload,
        size=args.size,
        model=args.model,
        batch_size=args.batch_size,
        budget_s=budget,
        repeats=args.repeats,
        warmup=args.warmup,
        steps=args.steps,
        device=args.device,
        workers=args.workers,
        threads=args.threads,
        only=comma_list(args.only),
        skip=comma_list(args.skip),
        peers=not args.no_peers,
        compile=not args.no_compile,
        ddp_procs=args.ddp,
        schedules=not args.no_schedules,
        data_dir=args.data_dir,
    )
    err = Console(stderr=True)
    with progress_bar("[bold]bench[/bold]", not args.quiet) as bar:
        task = bar.add_task("setup", total=None)

        class Sink:
            def set_total(self, total: int) -> None:
                bar.update(task, total=total)

            def advance(self, description: str) -> None:
                bar.update(task, advance=1, description=description)

        try:
            result = run_bench(opts, Sink())
        except FactoryError as e:
            return usage_error(f"--model: {e}")
        except (ValueError, TypeError) as e:
            return usage_error(str(e))
        except OSError as e:  # e.g. no space for the generated images
            err.print(f"pitstop bench: {e}")
            return 1
    report = to_report(result)
    if args.png:
        write_png(result, args.png)
        err.print(f"PNG chart: {args.png}")
    if args.markdown:
        from pitstop.report.jsonfmt import atomic_write_text

        atomic_write_text(__import__("pathlib").Path(args.markdown), markdown(result))
        err.print(f"Markdown table: {args.markdown}")
    if shows_tables(args):
        print_table(result, Console())
        for note in result.notes:
            err.print(f"note: {note}")
    return finish(report, args, html_blocks(result))  # bench's report meta carries 'interrupted'
