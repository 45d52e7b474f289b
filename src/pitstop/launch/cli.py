"""`pitstop launch`, `pitstop sysctl`, `pitstop monitor`: argument parsing only; the work is in the modules."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass

from pitstop.cliopts import add_options, opt
from pitstop.cliutil import add_output_args, command_after_dashes


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    _register_launch(sub)
    _register_sysctl(sub)
    _register_monitor(sub)


# ---------------------------------------------------------------- launch
CPU = "CPU binding"
TORCHRUN = "torchrun (many processes, many nodes)"


@dataclass
class LaunchArgs:
    ninstances: int = opt(1, "independent copies, each on its own cores", group=CPU)
    ncores_per_instance: int | None = opt(
        None, "cores per instance / local rank (default: split all)", group=CPU
    )
    core_list: str | None = opt(
        None, "CPUs to use, e.g. 0-15,32-47 (default: one thread per physical core)", group=CPU
    )
    node_id: int | None = opt(None, "use only this NUMA node's cores", group=CPU)
    use_logical_cores: bool = opt(False, "also use hyper-thread siblings", group=CPU)
    bind: str = opt(
        "auto",
        "how to bind: auto = numactl if installed, else taskset, else sched_setaffinity",
        choices=("auto", "numactl", "taskset", "affinity", "none"),
        group=CPU,
    )
    allocator: str = opt(
        "none",
        "LD_PRELOAD jemalloc or tcmalloc, or glibc: tune glibc malloc by environment to keep freed "
        "memory mapped (auto: jemalloc, else tcmalloc, else glibc)",
        choices=("none", "auto", "jemalloc", "tcmalloc", "glibc"),
        group=CPU,
    )
    env: Sequence[str] = opt([], "extra environment", metavar="KEY=VALUE", group=CPU)
    log_dir: str | None = opt(
        None, "write each instance's output to DIR/instance_N.log", group=CPU, output="dir"
    )
    nproc_per_node: int | None = opt(None, "processes on this node (wraps torchrun)", group=TORCHRUN)
    nnodes: int = opt(1, group=TORCHRUN)
    node_rank: int = opt(0, group=TORCHRUN)
    master_addr: str | None = opt(
        None, "rank-0 host; NCCL/GLOO_SOCKET_IFNAME is set to the interface reaching it", group=TORCHRUN
    )
    master_port: int = opt(29500, group=TORCHRUN)
    rdzv_endpoint: str | None = opt(
        None, "HOST:PORT for c10d rendezvous (instead of --master-addr)", group=TORCHRUN
    )
    rdzv_id: str = opt("pitstop", group=TORCHRUN)
    dry_run: bool = opt(False, "print the environment and commands, start nothing")
    cmd: Sequence[str] | None = opt(None, "-- train.py ARGS  |  -- -m module ARGS", remainder=True)


def _register_launch(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "launch",
        help="start training bound to cores with threads, allocator and torchrun set up",
        description=(
            "Start a script with CPU binding, OpenMP/MKL threads, an optional jemalloc/tcmalloc preload, "
            "several bound instances, or many processes through torchrun. Prints the exact environment "
            "and commands it runs. Example: pitstop launch --ninstances 2 -- infer.py --batch 16"
        ),
    )
    add_options(p, LaunchArgs)
    p.set_defaults(func=cmd_launch)


def cmd_launch(args: argparse.Namespace) -> int:
    import os
    import shutil
    import sys

    from pitstop.cliutil import usage_error
    from pitstop.host.cpu import cgroup_cpu_quota
    from pitstop.host.topology import numactl_path, read_topology
    from pitstop.launch.gpu_numa import nvidia_gpu_nodes
    from pitstop.launch.launcher import LaunchError, LaunchOptions, Tools, build_plan, describe, run_plan

    env: dict[str, str] = {}
    for item in args.env:
        k, sep, v = item.partition("=")
        if not sep or not k:
            return usage_error(f"--env expects KEY=VALUE, got {item!r}")
        env[k] = v
    opts = LaunchOptions(
        command=command_after_dashes(args),
        ninstances=args.ninstances,
        ncores_per_instance=args.ncores_per_instance,
        core_list=args.core_list,
        node_id=args.node_id,
        use_logical_cores=args.use_logical_cores,
        bind=args.bind,
        allocator=args.allocator,
        env=env,
        nproc_per_node=args.nproc_per_node,
        nnodes=args.nnodes,
        node_rank=args.node_rank,
        master_addr=args.master_addr,
        master_port=args.master_port,
        rdzv_endpoint=args.rdzv_endpoint,
        rdzv_id=args.rdzv_id,
    )
    try:
        allowed = os.sched_getaffinity(0)
    except (AttributeError, OSError):
        allowed = None
    try:
        tools = Tools(numactl_path(), shutil.which("taskset"))
        gpus = nvidia_gpu_nodes() if opts.distributed else None
        plan = build_plan(
            opts, read_topology(), os.environ, tools, allowed, gpu_nodes=gpus, cpu_quota=cgroup_cpu_quota()
        )
    except LaunchError as e:
        return usage_error(str(e))
    print(describe(plan), file=sys.stdout if args.dry_run else sys.stderr, flush=True)
    if args.dry_run:
        return 0
    return run_plan(plan, args.log_dir)


# ---------------------------------------------------------------- sysctl
@dataclass
class SysctlArgs:
    apply: bool = opt(False, "write the recommended values to the drop-in file")
    revert: bool = opt(False, "restore the state before the last --apply")
    path: str | None = opt(None, "drop-in file (default /etc/sysctl.d/90-pitstop.conf)")
    yes: bool = opt(False, "do not ask for confirmation", flags=("--yes", "-y"))
    all: bool = opt(
        False, "print every parameter, passes included (default: problems, and a count of passes)"
    )
    # Roots of the kernel trees read, for tests and containers with a mounted host /proc.
    proc_sys: str = opt("/proc/sys", argparse.SUPPRESS)
    sys_root: str = opt("/sys", argparse.SUPPRESS)


def _register_sysctl(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "sysctl",
        help="kernel parameters that matter for training: current vs recommended, apply with consent",
        description=(
            "Show current vs recommended kernel parameters for training with the reason. --apply writes a "
            "sysctl.d drop-in (after confirmation; --yes to skip), keeping a backup; --revert restores it."
        ),
    )
    add_options(p, SysctlArgs)
    add_output_args(p)
    p.set_defaults(func=cmd_sysctl)


def cmd_sysctl(args: argparse.Namespace) -> int:
    from pitstop.launch.sysctl_cli import run_sysctl

    return run_sysctl(args)


# ---------------------------------------------------------------- monitor
@dataclass
class MonitorArgs:
    interval: float = opt(1.0, "seconds between samples (default 1)")
    duration: float | None = opt(None, "stop after this many seconds")
    csv: str | None = opt(None, "append every sample to this CSV file", metavar="FILE", output="file")
    plot: str | None = opt(None, "draw a CSV written by --csv to a PNG and exit", metavar="CSV")
    out: str | None = opt(
        None, "PNG path for --plot (default: the CSV path with .png)", metavar="PNG", output="file"
    )
    low_util: float = opt(70.0, "GPU utilization threshold in %% (default 70)")
    window: float = opt(30.0, "seconds it must stay low to be flagged (default 30)")
    command_log: str | None = opt(
        None, "keep the followed command's full output in FILE", metavar="FILE", output="file"
    )
    no_live: bool = opt(False, "no live screen (also off when not a terminal)")
    cmd: Sequence[str] | None = opt(None, "-- COMMAND ARGS to start and follow", remainder=True)


def _register_monitor(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "monitor",
        help="live GPU, CPU, RAM, disk and network view; follows a command; CSV log and plot",
        description=(
            "A live view of GPU utilization, memory, power and clocks (NVML), CPU per core, RAM, disk and "
            "network. With -- COMMAND it starts the command, follows it and exits with its exit code. "
            "Flags GPU utilization under the threshold sustained while training runs."
        ),
    )
    add_options(p, MonitorArgs)
    add_output_args(p, html=False)
    p.set_defaults(func=cmd_monitor)


def cmd_monitor(args: argparse.Namespace) -> int:
    from pitstop.launch.monitor_cli import run_monitor

    return run_monitor(args, command_after_dashes(args))
