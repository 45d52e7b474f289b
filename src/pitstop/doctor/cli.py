"""`pitstop doctor [--data PATH] [--no-write] [--json FILE] [--html FILE]`."""

from __future__ import annotations

import argparse
from pathlib import Path

from pitstop.cliutil import add_output_args, finish, progress_bar, shows_tables, usage_error


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "doctor",
        help="audit this machine and the torch install for training speed",
        description="Audit GPU, CUDA/cuDNN/NCCL vs the torch build, CPU, memory, storage (measured read "
        "speed), system limits and the Python environment. Changes nothing.",
    )
    p.add_argument("--data", metavar="PATH", default=".", help="training data path to check (default: cwd)")
    p.add_argument(
        "--no-write",
        action="store_true",
        help="never write the temporary read-test file under PATH (measure the largest existing file only)",
    )
    p.add_argument(
        "--read-seconds",
        type=float,
        default=1.5,
        metavar="S",
        help="time bound of the read-speed test (default 1.5)",
    )
    add_output_args(p)
    p.set_defaults(func=cmd_doctor)


def cmd_doctor(args: argparse.Namespace) -> int:
    if not 0 < args.read_seconds <= 60:
        return usage_error("--read-seconds must be in (0, 60]")
    from pitstop.doctor.html import doctor_blocks
    from pitstop.doctor.runner import DoctorOptions, run_doctor

    opts = DoctorOptions(data_path=args.data, allow_write=not args.no_write, read_seconds=args.read_seconds)
    with progress_bar("doctor:", shows_tables(args), bar=False) as bar:
        task = bar.add_task("starting", total=None)

        def progress(name: str, done: int, total: int) -> None:
            bar.update(task, description=name)

        report = run_doctor(opts, progress)
    if not Path(args.data).exists():
        report.meta["data_path_missing"] = True
    return finish(report, args, doctor_blocks(report))
