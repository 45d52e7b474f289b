"""``pitstop profile [options] -- python train.py ARGS``."""

from __future__ import annotations

import argparse
import functools
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pitstop.cliopts import add_options, opt, options_from, output_problem
from pitstop.cliutil import (
    EXIT_INTERRUPTED,
    add_output_args,
    command_after_dashes,
    finish,
    progress_bar,
    shows_tables,
    usage_error,
)

if TYPE_CHECKING:
    from rich.console import Console

    from pitstop.findings import Report
    from pitstop.profile.runs.runner import RunResult, RunSpec

EXIT_SCRIPT_FAILED = 1


@dataclass
class ProfileArgs:
    steps: int = opt(30, "measured optimizer steps after warm-up (default 30)")
    warmup: int = opt(5, "steps run before measuring (default 5)")
    full: bool = opt(False, "run the script to its end instead of stopping")
    timeout: float | None = opt(None, "stop a script running longer (s)", metavar="S")
    trace: bool = opt(False, "also record a torch.profiler Chrome trace")
    out_dir: str | None = opt(
        None, "keep the run's files (measurements, trace) here", metavar="DIR", output="dir"
    )
    no_probes: bool = opt(False, "skip the measured what-ifs after the run")
    tensorboard: str | None = opt(
        None,
        "also write the step breakdown and findings as TensorBoard scalars and text here",
        metavar="DIR",
        output="dir",
    )
    budget: float = opt(
        60.0,
        "seconds the probes and the fresh confirmation runs may add after the measured steps (default 60); "
        "a confirmation whose first round does not fit is not run and its finding says so",
        metavar="S",
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


# ``pitstop profile --verify``: times the top warning's fix (``pitstop.fix.verify.verify``). The CLI hands
# it in (``pitstop.cli``), as profile's stages sit below fix and may not import it.
Verify = Callable[["Report", Sequence[str], float, "Path | None"], None]


def register(subparsers: argparse._SubParsersAction, verify: Verify | None = None) -> None:  # type: ignore[type-arg]
    p = subparsers.add_parser(
        "profile",
        help="run a training script unmodified, time every step, rank what costs time",
        description="Run a training script as it is (no code change), time every step (data wait, copies, "
        "forward, backward, optimizer, host syncs), find loader settings and syncs with their file:line, and "
        "rank findings by the time they cost. Usage: pitstop profile [options] -- python train.py ARGS",
    )
    add_options(p, ProfileArgs)
    add_output_args(p)
    p.set_defaults(func=functools.partial(cmd_profile, verify=verify))


def cmd_profile(args: argparse.Namespace, verify: Verify | None = None) -> int:
    from rich.console import Console

    from pitstop.profile.analyze import summary
    from pitstop.profile.present.render import html_blocks, print_breakdown
    from pitstop.profile.present.render_ranks import print_ranks
    from pitstop.profile.present.tensorboard import unavailable as tensorboard_unavailable
    from pitstop.profile.runs.runner import CommandError, RunSpec, parse_command, run

    o = options_from(ProfileArgs, args)
    cmd = command_after_dashes(args)
    if (o.cmd or [])[:1] == ["merge"]:  # pitstop profile merge DIR: the ranks a multi-node launch left
        from pitstop.profile.ranks_cli import cmd_merge

        return cmd_merge(args, cmd[1:])
    if o.steps < 1 or o.warmup < 0:
        return usage_error("--steps must be >= 1 and --warmup >= 0")
    if o.timeout is not None and o.timeout <= 0:
        return usage_error("--timeout must be > 0")
    if o.budget <= 0:
        return usage_error("--budget needs seconds > 0")
    if o.verify is not None and o.verify <= 0:
        return usage_error("--verify needs a budget > 0 seconds")
    if o.verify is not None and verify is None:
        return usage_error("--verify runs pitstop fix: use it through the pitstop command")
    if o.tensorboard and (why := tensorboard_unavailable()) is not None:
        return usage_error(why)
    try:
        parse_command(cmd)
    except CommandError as e:
        return usage_error(str(e))
    out_dir = Path(o.out_dir) if o.out_dir else None
    if o.trace and out_dir is None:  # the trace's folder: checked here, --out-dir is checked by the CLI
        out_dir = Path("pitstop-report-profile")
        why = output_problem(out_dir, "dir")
        if why:
            return usage_error(f"cannot write the trace to {out_dir}: {why}")
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
    if show:
        err.print(
            f"pitstop profile: {spec.warmup} warm-up + {spec.steps} measured steps, then probes and fresh "
            f"confirmation runs within {o.budget:.0f} s (--budget S to change)"
        )
    with progress_bar("[bold]pitstop profile[/bold]", show) as bar:
        task = bar.add_task("steps", total=spec.warmup + spec.steps)

        def progress(done: int, total: int) -> None:
            bar.update(task, completed=min(done, total))

        result = run(spec, out_dir=out_dir, progress=progress)
    say = (lambda m: err.print(m)) if show else None
    report = measured_report(spec, result, o.verify, out_dir, say, o.budget, verify)
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
    if result.status == "interrupted" or report.meta.get("interrupted"):
        return EXIT_INTERRUPTED
    if not result.ok:
        if not shows_tables(args):  # else the report above quoted it, with the script's traceback
            print(f"pitstop profile: {result.error}", file=sys.stderr)
        return EXIT_SCRIPT_FAILED
    return code


def measured_report(
    spec: RunSpec,
    result: RunResult,
    verify_s: float | None,
    out_dir: Path | None,
    say: Callable[[str], None] | None,
    budget_s: float | None = None,
    verify: Verify | None = None,
) -> Report:
    """The run's report after its fresh confirmation runs (within ``budget_s``: ``pitstop.profile.confirm.budget``)
    and ``--verify``; ``meta["timings"]``: the seconds each stage took. Ctrl-C or SIGTERM in any phase
    stops it there: the report holds what was measured, ``meta["interrupted"]`` names the phase (exit
    130), and the verdict says it was cut short (never healthy)."""
    from pitstop.profile.analyze import summary
    from pitstop.profile.confirm.budget import stages
    from pitstop.profile.confirm.fix_verdicts import annotate_profile
    from pitstop.profile.confirm.fresh_confirm import confirm_all

    phase, report = None, None
    try:
        if result.status == "interrupted":  # in the script or its exit probes: the report says which
            report = result.report()
            phase = (report.meta.get(summary.BASIS) or {}).get("interrupted", "the script run")
            return _interrupted(report, phase)
        phase = "the fresh confirmation runs"  # predictions that would warn, timed again with the fix
        confirm_all(
            spec, result, say=(lambda m: say(f"pitstop profile: {m}")) if say else None, budget_s=budget_s
        )
        phase = None
        report = result.report()
        report.meta["timings"] = result.data.get("answer_time") or stages(result).to_dict()
        report.findings = annotate_profile(report.findings, spec.command, out_dir)  # what `fix` measured
        if verify_s and result.ok and verify is not None:
            phase = "--verify"
            if say:
                say(f"pitstop profile --verify: timing the top warning's fix (at most {verify_s:.0f} s)")
            t0 = time.monotonic()
            verify(report, spec.command, verify_s, out_dir)
            report.meta["timings"]["verify_s"] = round(time.monotonic() - t0, 2)
            phase = None
    except KeyboardInterrupt:
        phase = phase or "the report"
        report = report or result.report()
    return _interrupted(report, phase) if phase else report


def _interrupted(report: Report, phase: str) -> Report:
    """``report`` marked as stopped by Ctrl-C or SIGTERM during ``phase``: ``meta["interrupted"]`` (exit
    130), the verdict's basis (``summary.interrupted``, given by ``summary.reconcile``) and its error."""
    from pitstop.profile.analyze import summary

    report.meta["interrupted"] = phase
    if isinstance(report.meta.get(summary.BASIS), dict):
        report.meta[summary.BASIS]["interrupted"] = phase
    report.error = (
        report.error or f"interrupted (Ctrl-C or SIGTERM) during {phase}; what was measured is kept"
    )
    return report


def _write_tensorboard(report: Report, log_dir: str | None, err: Console) -> None:
    """``--tensorboard DIR``: the report as TensorBoard event files (nothing without the option)."""
    if not log_dir:
        return
    from pitstop.profile.present.tensorboard import write_tensorboard

    tb = write_tensorboard(report, log_dir)
    err.print(f"TensorBoard: {tb} (open with: tensorboard --logdir {tb})")
