"""`pitstop doctor [--data PATH] [--no-write] [--json FILE] [--html FILE]`."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from pitstop.cliopts import add_options, opt, options_from
from pitstop.cliutil import add_output_args, finish, progress_bar, shows_tables, usage_error


@dataclass
class DoctorArgs:
    data: str = opt(".", "training data path to check (default: cwd)", metavar="PATH")
    no_write: bool = opt(
        False, "never write the temporary read-test file under PATH (measure the largest existing file only)"
    )
    read_seconds: float = opt(1.5, "time bound of the read-speed test (default 1.5)", metavar="S")
    all: bool = opt(False, "print every check, passes included (default: problems, and a count of passes)")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "doctor",
        help="audit this machine and the torch install for training speed",
        description="Audit GPU, CUDA/cuDNN/NCCL vs the torch build, CPU, memory, storage (measured read "
        "speed), system limits and the Python environment. Changes nothing.",
    )
    add_options(p, DoctorArgs)
    add_output_args(p)
    p.set_defaults(func=cmd_doctor)


def cmd_doctor(args: argparse.Namespace) -> int:
    o = options_from(DoctorArgs, args)
    if not 0 < o.read_seconds <= 60:
        return usage_error("--read-seconds must be in (0, 60]")
    from pitstop.doctor.html import doctor_blocks
    from pitstop.doctor.runner import DoctorOptions, run_doctor

    opts = DoctorOptions(data_path=o.data, allow_write=not o.no_write, read_seconds=o.read_seconds)
    with progress_bar("doctor:", shows_tables(args), bar=False) as bar:
        task = bar.add_task("starting", total=None)

        def progress(name: str, done: int, total: int) -> None:
            bar.update(task, description=name)

        report = run_doctor(opts, progress)
    if not Path(o.data).exists():
        report.meta["data_path_missing"] = True
    return finish(report, args, doctor_blocks(report), passes="all" if o.all else "count")
