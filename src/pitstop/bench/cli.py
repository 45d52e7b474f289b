"""`pitstop bench`: the tuning guides' claims, measured on this machine."""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pitstop.cliopts import add_options, opt, options_from
from pitstop.cliutil import add_output_args, comma_list, finish, progress_bar, shows_tables, usage_error

if TYPE_CHECKING:
    from pitstop.bench.runner import BenchOptions, BenchResult

UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_budget(text: str) -> float:
    """'5m', '90s', '1.5h', '300' -> seconds."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*", text)
    if not m or float(m.group(1)) <= 0:
        raise ValueError(f"bad --budget {text!r}: use e.g. 5m, 90s, 300")
    return float(m.group(1)) * UNITS[m.group(2)]


@dataclass
class BenchArgs:
    workload: str = opt("vision", choices=("vision", "language", "tabular"))
    size: str = opt("small", choices=("tiny", "small", "medium", "large"))
    model: str | None = opt(
        None, "your own model (a factory returning an nn.Module)", metavar="PKG.MOD:FACTORY"
    )
    batch_size: int | None = opt(None, "override the size preset's batch size")
    budget: str = opt("5m", "time budget; steps are scaled to fit (default 5m)")
    repeats: int = opt(3, "interleaved timed blocks per config (default 3)")
    warmup: int = opt(2, "warm-up steps per config (default 2)")
    steps: int | None = opt(None, "steps per timed block (default: scaled to the budget)")
    device: str = opt("auto", choices=("auto", "cpu", "cuda"))
    threads: int | None = opt(None, "torch threads (default: torch's choice)")
    workers: int = opt(2, "num_workers for the workers row (default 2)")
    only: str | None = opt(None, "comma-separated configs to run (the baseline always runs)")
    skip: str | None = opt(None, "comma-separated configs to leave out")
    no_peers: bool = opt(False, "leave out the Lightning and Accelerate rows")
    no_compile: bool = opt(False, "leave out the torch.compile rows")
    no_schedules: bool = opt(False, "leave out OneCycle vs StepLR")
    ddp: int | None = opt(None, "DDP processes (default 2 on CPU, all GPUs; 0: none)", metavar="N")
    data_dir: str | None = opt(
        None, "where to write the generated JPEG folder (default: a temp dir)", output="dir"
    )
    png: str | None = opt(
        None, "write a PNG chart of speed-ups and memory ratios", metavar="FILE", output="file"
    )
    markdown: str | None = opt(None, "write the table as Markdown", metavar="FILE", output="file")


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "bench",
        help="measure the tuning guides' claims (AMP, workers, checkpointing, compile, DDP ...) on this machine",
        description="Ablation benchmark: baseline, each optimization alone and all together, plus Lightning, "
        "Accelerate, OneCycle vs StepLR and DDP 1 vs N processes. Every number is measured in this run.",
    )
    add_options(p, BenchArgs)
    add_output_args(p)
    p.set_defaults(func=cmd_bench)


def cmd_bench(args: argparse.Namespace) -> int:
    o = options_from(BenchArgs, args)
    try:
        budget = parse_budget(o.budget)
    except ValueError as e:
        return usage_error(str(e))
    if problem := _usage_problem(o):
        return usage_error(problem)
    from rich.console import Console

    from pitstop.bench.results import html_blocks, markdown, print_table, to_report, write_png
    from pitstop.factory import FactoryError

    err = Console(stderr=True)
    try:
        result = _run(_bench_options(o, budget), quiet=args.quiet)
    except FactoryError as e:
        return usage_error(f"--model: {e}")
    except (ValueError, TypeError) as e:
        return usage_error(str(e))
    except OSError as e:  # e.g. no space for the generated images
        err.print(f"pitstop bench: {e}")
        return 1
    report = to_report(result)
    if o.png:
        write_png(result, o.png)
        err.print(f"PNG chart: {o.png}")
    if o.markdown:
        from pitstop.report.jsonfmt import atomic_write_text

        atomic_write_text(__import__("pathlib").Path(o.markdown), markdown(result))
        err.print(f"Markdown table: {o.markdown}")
    if shows_tables(args):
        print_table(result, Console())
        for note in result.notes:
            err.print(f"note: {note}")
    return finish(report, args, html_blocks(result))  # bench's report meta carries 'interrupted'


def _usage_problem(o: BenchArgs) -> str | None:
    """The usage error in the arguments (other than --budget), if any: counts under 1, --png without
    matplotlib, unknown config names, --device cuda without CUDA."""
    for flag in ("repeats", "warmup", "steps", "threads", "batch_size"):
        v = getattr(o, flag)
        if v is not None and v < 1:
            return f"--{flag.replace('_', '-')} must be at least 1"
    if o.workers < 1:
        return "--workers must be at least 1"

    import torch

    from pitstop.bench.configs import CLAIMS
    from pitstop.plotting import unavailable

    if o.png and (missing := unavailable("--png")):
        return missing
    known = set(CLAIMS) | {"baseline", "all_compiled"}
    unknown = [n for n in comma_list(o.only) + comma_list(o.skip) if n not in known]
    if unknown:
        return f"unknown config(s) {', '.join(unknown)}; choose from {', '.join(sorted(known))}"
    if o.device == "cuda" and not torch.cuda.is_available():
        return "--device cuda: torch sees no CUDA device here"
    return None


def _bench_options(o: BenchArgs, budget_s: float) -> BenchOptions:
    """The runner's options from the command line's."""
    from pitstop.bench.runner import BenchOptions

    return BenchOptions(
        workload=o.workload,
        size=o.size,
        model=o.model,
        batch_size=o.batch_size,
        budget_s=budget_s,
        repeats=o.repeats,
        warmup=o.warmup,
        steps=o.steps,
        device=o.device,
        workers=o.workers,
        threads=o.threads,
        only=comma_list(o.only),
        skip=comma_list(o.skip),
        peers=not o.no_peers,
        compile=not o.no_compile,
        ddp_procs=o.ddp,
        schedules=not o.no_schedules,
        data_dir=o.data_dir,
    )


def _run(opts: BenchOptions, quiet: bool) -> BenchResult:
    """``run_bench`` behind a progress bar (none with ``quiet``)."""
    from pitstop.bench.runner import run_bench

    with progress_bar("[bold]bench[/bold]", not quiet) as bar:
        task = bar.add_task("setup", total=None)

        class Sink:
            def set_total(self, total: int) -> None:
                bar.update(task, total=total)

            def advance(self, description: str) -> None:
                bar.update(task, advance=1, description=description)

        return run_bench(opts, Sink())
