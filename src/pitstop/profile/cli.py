"""``pitstop profile [options] -- python train.py ARGS``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pitstop.cliopts import add_options, opt, options_from

if TYPE_CHECKING:
    from rich.console import Console

    from pitstop.findings import Report
from pitstop.cliutil import (
    EXIT_INTERRUPTED,
    add_output_args,
    command_after_dashes,
    finish,
    progress_bar,
    shows_tables,
    usage_error,
)

EXIT_SCRIPT_FAILED = 1


@dataclass
class ProfileArgs:
    steps: int = opt(30, "measured optimizer steps after warm-up (default 30)")
    warmup: int = opt(5, "steps run before measuring (default 5)")
    full: bool = opt(False, "run the script to its end instead of stopping")
    timeout: float | None = opt(None, "stop a script running longer (s)", metavar="S")
    trace: bool = opt(False, "also record a torch.profiler Chrome trace")
    out_dir: str | None = opt(None, "keep the run's files (measurements, trace) here", metavar="DIR")
    no_probes: bool = opt(False, "skip the measured what-ifs after the run")
    tensorboard: str | None = opt(
        None, "also write the step breakdown and findings as TensorBoard scalars and text here", metavar="DIR"
    )
    verify: float | None = opt(
        None,
        "then time the top warning's fix on the script (as pitstop fix does, S seconds, default 120) "
        "and show the measured speed-up next to the predicted one",
        nargs="?",
        const=120.0,
        metavar="S",
    )
    cmd: Sequence[str] | None = opt(
        None, "-- python train.py ARGS (or -m module, or torchrun ...); or: merge DIR", remainder=True
    )


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparsers.add_parser(
        "profile",
        help="run a training script unmodified, time every step, rank what costs time",
        description="Run a training script as it is (no code change), time every step (data wait, copies, "
        "forward, backward, optimizer, host syncs), find loader settings and syncs with their file:line, and "
        "rank findings by the time they cost. Usage: pitstop profile [options] -- python train.py ARGS",
    )
    add_options(p, ProfileArgs)
    add_output_args(p)
    p.set_defaults(func=cmd_profile)


def cmd_profile(args: argparse.Namespace) -> int:
    from pathlib import Path

    from rich.console import Console

    from pitstop.profile import summary
    from pitstop.profile.fresh_confirm import confirm_all
    from pitstop.profile.render import html_blocks, print_breakdown
    from pitstop.profile.render_ranks import print_ranks
    from pitstop.profile.runner import CommandError, RunSpec, parse_command, run
    from pitstop.report.tensorboard import unavailable as tensorboard_unavailable
    from pitstop.tune.verdict_cache import annotate_profile

    o = options_from(ProfileArgs, args)
    cmd = command_after_dashes(args)
    if (o.cmd or [])[:1] == ["merge"]:  # pitstop profile merge DIR: the ranks a multi-node launch left
        from pitstop.profile.ranks_cli import cmd_merge

        return cmd_merge(args, cmd[1:])
    if o.steps < 1 or o.warmup < 0:
        return usage_error("--steps must be >= 1 and --warmup >= 0")
    if o.timeout is not None and o.timeout <= 0:
        return usage_error("--timeout must be > 0")
    if o.verify is not None and o.verify <= 0:
        return usage_error("--verify needs a budget > 0 seconds")
    if o.tensorboard and (why := tensorboard_unavailable()) is not None:
        return usage_error(why)
    try:
        parse_command(cmd)
    except CommandError as e:
        return usage_error(str(e))
    out_dir = Path(o.out_dir) if o.out_dir else None
    if o.trace and out_dir is None:
        out_dir = Path("pitstop-report-profile")
    spec = RunSpec(
        command=cmd,
        steps=o.steps,
        warmup=o.warmup,
        full=o.full,
        timeout=o.timeout,
        trace=o.trace,
        probes=not o.no_probes,
        stdout_to_stderr=args.json == "-",
    )
    err = Console(stderr=True)
    show = err.is_terminal and not args.quiet
    with progress_bar("[bold]pitstop profile[/bold]", show) as bar:
        task = bar.add_task("steps", total=spec.warmup + spec.steps)

        def progress(done: int, total: int) -> None:
            bar.update(task, completed=min(done, total))

        result = run(spec, out_dir=out_dir, progress=progress)
    # predictions that would warn, timed again in fresh runs with the fix injected
    confirm_all(spec, result, say=(lambda m: err.print(f"pitstop profile: {m}")) if show else None)
    report = result.report()
    report.findings = annotate_profile(report.findings, cmd, out_dir)  # what `pitstop fix` measured before
    if o.verify and result.ok:
        from pitstop.profile.verify import verify

        if show:
            err.print(f"pitstop profile --verify: timing the top warning's fix (at most {o.verify:.0f} s)")
        verify(report, cmd, o.verify, out_dir)
    summary.reconcile(report)  # the verdict for the findings as fix's verdicts and --verify left them
    if shows_tables(args):
        print_breakdown(report, Console())
        print_ranks(report, Console())
    code = finish(report, args, html_blocks(report))
    _write_tensorboard(report, o.tensorboard, err)
    if result.trace_path and not args.quiet:
        err.print(f"Chrome trace: {result.trace_path} (open in https://ui.perfetto.dev or chrome://tracing)")
    if result.status == "not_started":
        return 2
    if result.status == "interrupted":
        return EXIT_INTERRUPTED
    if not result.ok:
        if not shows_tables(args):  # else the report above quoted it, with the script's traceback
            print(f"pitstop profile: {result.error}", file=sys.stderr)
        return EXIT_SCRIPT_FAILED
    return code


def _write_tensorboard(report: Report, log_dir: str | None, err: Console) -> None:
    """``--tensorboard DIR``: the report as TensorBoard event files (nothing without the option)."""
    if not log_dir:
        return
    from pitstop.report.tensorboard import write_tensorboard

    tb = write_tensorboard(report, log_dir)
    err.print(f"TensorBoard: {tb} (open with: tensorboard --logdir {tb})")
