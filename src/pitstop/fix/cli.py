"""`pitstop fix` and `fix --apply`: argument parsing; the work is in the modules (``fix``: the candidates,
``runs``: the runs, ``report``: the report, ``apply``: the edits, ``verdict_cache``: what later
profiles show)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from pitstop.cliopts import add_options, options_from
from pitstop.cliutil import add_output_args, command_after_dashes, print_table
from pitstop.fix.cli_options import FixArgs


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "fix",
        help="re-run your script with each suggested fix injected; report the measured speed-up and the diff",
        description=(
            "Profile the script, then re-run it for a bounded number of steps with each candidate fix "
            "injected (DataLoader workers, autocast, channels_last, foreach optimizer, torch.compile, "
            "cudnn.benchmark), interleaved with the unmodified baseline; keep the fixes that are faster with "
            "a finite loss close to the baseline's, measure them combined, and print the code change "
            "(a unified diff for DataLoader arguments). Example: pitstop fix -- python train.py"
        ),
    )
    add_options(p, FixArgs)
    add_output_args(p)
    p.set_defaults(func=cmd_fix)


def cmd_fix(args: argparse.Namespace) -> int:
    from pitstop.cliutil import finish, usage_error

    o = options_from(FixArgs, args)
    cmd = command_after_dashes(args)
    if not cmd:
        return usage_error("give the script to fix after --, e.g. pitstop fix -- python train.py")
    try:
        cfg = _fix_config(o)
    except ValueError as e:
        return usage_error(str(e))
    from pitstop.fix.progress import fix_progress
    from pitstop.fix.report import fix_report
    from pitstop.fix.runs import run_fix

    with fix_progress(cfg.budget, not args.quiet) as update:
        result = run_fix(cmd, cfg, progress=update)
    from pitstop.fix.verdict_cache import record

    record(result, o.out_dir)  # a later profile of this script shows what its fixes measured
    report, blocks = fix_report(result, {"command": " ".join(cmd)})
    _print_verdicts(args, result)
    code = finish(report, args, blocks)  # the diff is in the report, once (fix.summary's code)
    if o.apply and (stop := _apply_fix(o, result, cfg, code)) is not None:
        return stop
    if result.baseline_error and not result.baseline_steps:
        return 1
    return code


def _fix_config(o: Any) -> Any:
    """The ``FixConfig`` from fix's options (``FixArgs``); ValueError with the usage message when an
    option is out of range, a candidate is unknown or the profile runner cannot be imported."""
    if (
        (o.steps is not None and o.steps <= 0)
        or o.warmup < 0
        or o.budget <= 0
        or not 2 <= o.min_rounds <= o.max_rounds
        or o.min_gain < 0
        or o.loss_rtol <= 0
    ):
        raise ValueError(
            "need --steps > 0, --warmup >= 0, --budget > 0, 2 <= --min-rounds <= --max-rounds, "
            "--min-gain >= 0, --loss-rtol > 0"
        )
    try:
        from pitstop.fix.core import FixConfig, parse_candidates
    except ImportError as e:
        raise ValueError(f"pitstop fix needs the profile runner, which is not available: {e}") from e
    names = parse_candidates(o.candidates)
    skip = parse_candidates(o.skip) or () if o.skip.strip() else ()
    return FixConfig(
        steps=o.steps,
        warmup=o.warmup,
        budget=o.budget,
        min_rounds=o.min_rounds,
        max_rounds=o.max_rounds,
        candidates=names,
        skip=tuple(skip),
        min_gain=o.min_gain,
        loss_rtol=o.loss_rtol,
        timeout=o.timeout,
    )


def _print_verdicts(args: argparse.Namespace, result: Any) -> None:
    """The verdicts table: the baseline, every candidate and the combination, one row each."""
    rows = [
        [m.name, m.verdict, m.interval.text() if m.interval else "", m.throughput, m.median, m.reason]
        for m in [result.baseline, *result.candidates, *([result.combined] if result.combined else [])]
    ]
    print_table(
        args,
        "pitstop fix: verdicts",
        [
            "configuration",
            "verdict",
            "throughput speed-up (95% interval)",
            "steps/s",
            "median steps/s",
            "note",
        ],
        rows,
    )


def _apply_fix(o: Any, result: Any, cfg: Any, code: int) -> int | None:
    """--apply: write the fix's patches (after asking unless --yes) and verify them. Returns the exit
    status when the command ends here (a usage error, or the report's ``code`` when the answer was
    no), else None."""
    from pitstop.cliutil import usage_error
    from pitstop.fix.apply import apply_all
    from pitstop.fix.apply_verify import verify

    if not result.patches:
        print("pitstop fix: nothing to apply (no fix with a code location helped)", file=sys.stderr)
        return None
    if not o.yes:
        if not sys.stdin.isatty():
            return usage_error("--apply needs confirmation; pass --yes to apply without asking")
        names = ", ".join(str(p.path) for p in result.patches)
        answer = input(f"Apply this change to {names} (a backup is kept)? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            print("not applied", file=sys.stderr)
            return code
    try:
        backups = apply_all(result.patches)
    except (OSError, ValueError) as e:
        return usage_error(f"could not apply: {e}")
    for p, backup in zip(result.patches, backups, strict=True):
        print(f"applied to {p.path}; backup at {backup}", file=sys.stderr)
    print(f"pitstop fix: {verify(result, cfg).text}", file=sys.stderr)
    return None
