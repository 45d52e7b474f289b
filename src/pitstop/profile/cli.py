"""``pitstop profile [options] -- python train.py ARGS``."""

from __future__ import annotations

import argparse
import sys

from pitstop.cliutil import (
    EXIT_INTERRUPTED,
    add_output_args,
    command_after_dashes,
    finish,
    progress_bar,
    usage_error,
)

EXIT_SCRIPT_FAILED = 1


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparsers.add_parser(
        "profile",
        help="run a training script unmodified, time every step, rank what costs time",
        description="Run a training script as it is (no code change), time every step (data wait, copies, "
        "forward, backward, optimizer, host syncs), find loader settings and syncs with their file:line, and "
        "rank findings by the time they cost. Usage: pitstop profile [options] -- python train.py ARGS",
    )
    p.add_argument(
        "--steps", type=int, default=30, help="measured optimizer steps after warm-up (default 30)"
    )
    p.add_argument("--warmup", type=int, default=5, help="steps run before measuring (default 5)")
    p.add_argument("--full", action="store_true", help="run the script to its end instead of stopping")
    p.add_argument(
        "--timeout", type=float, default=None, metavar="S", help="stop a script running longer (s)"
    )
    p.add_argument("--trace", action="store_true", help="also record a torch.profiler Chrome trace")
    p.add_argument("--out-dir", metavar="DIR", help="keep the run's files (measurements, trace) here")
    p.add_argument("--no-probes", action="store_true", help="skip the measured what-ifs after the run")
    p.add_argument(
        "--verify",
        type=float,
        nargs="?",
        const=120.0,
        metavar="S",
        help="then time the top warning's fix on the script (as pitstop fix does, S seconds, default 120) "
        "and show the measured speed-up next to the predicted one",
    )
    add_output_args(p)
    p.add_argument(
        "cmd",
        nargs=argparse.REMAINDER,
        help="-- python train.py ARGS (or -m module, or torchrun ...); or: merge DIR",
    )
    p.set_defaults(func=cmd_profile)


def cmd_profile(args: argparse.Namespace) -> int:
    from pathlib import Path

    from rich.console import Console

    from pitstop.profile.malloc_confirm import BUDGET_S, maybe_confirm, worth_confirming
    from pitstop.profile.render import html_blocks, print_breakdown
    from pitstop.profile.render_ranks import print_ranks
    from pitstop.profile.runner import CommandError, RunSpec, parse_command, run
    from pitstop.tune.verdict_cache import annotate_profile

    cmd = command_after_dashes(args)
    if (args.cmd or [])[:1] == ["merge"]:  # pitstop profile merge DIR: the ranks a multi-node launch left
        from pitstop.profile.ranks_cli import cmd_merge

        return cmd_merge(args, cmd[1:])
    if args.steps < 1 or args.warmup < 0:
        return usage_error("--steps must be >= 1 and --warmup >= 0")
    if args.timeout is not None and args.timeout <= 0:
        return usage_error("--timeout must be > 0")
    if args.verify is not None and args.verify <= 0:
        return usage_error("--verify needs a budget > 0 seconds")
    try:
        parse_command(cmd)
    except CommandError as e:
        return usage_error(str(e))
    out_dir = Path(args.out_dir) if args.out_dir else None
    if args.trace and out_dir is None:
        out_dir = Path("pitstop-report-profile")
    spec = RunSpec(
        command=cmd,
        steps=args.steps,
        warmup=args.warmup,
        full=args.full,
        timeout=args.timeout,
        trace=args.trace,
        probes=not args.no_probes,
        stdout_to_stderr=args.json == "-",
    )
    err = Console(stderr=True)
    show = err.is_terminal and not args.quiet
    with progress_bar("[bold]pitstop profile[/bold]", show) as bar:
        task = bar.add_task("steps", total=spec.warmup + spec.steps)

        def progress(done: int, total: int) -> None:
            bar.update(task, completed=min(done, total))

        result = run(spec, out_dir=out_dir, progress=progress)
    if worth_confirming(result) and spec.probes:
        if show:
            err.print(f"pitstop profile: timing the page-fault fix in fresh runs (at most {BUDGET_S:.0f} s)")
        maybe_confirm(spec, result)  # the malloc probe cannot be interleaved in one process
    report = result.report()
    report.findings = annotate_profile(report.findings, cmd, out_dir)  # what `pitstop fix` measured before
    if args.verify and result.ok:
        from pitstop.profile.verify import verify

        if show:
            err.print(f"pitstop profile --verify: timing the top warning's fix (at most {args.verify:.0f} s)")
        verify(report, cmd, args.verify, out_dir)
    if not args.quiet and args.json != "-":
        print_breakdown(report, Console())
        print_ranks(report, Console())
    code = finish(report, args, html_blocks(report))
    if result.trace_path and not args.quiet:
        err.print(f"Chrome trace: {result.trace_path} (open in https://ui.perfetto.dev or chrome://tracing)")
    if result.status == "not_started":
        return 2
    if result.status == "interrupted":
        return EXIT_INTERRUPTED
    if not result.ok:
        print(f"pitstop profile: {result.error}", file=sys.stderr)
        return EXIT_SCRIPT_FAILED
    return code
