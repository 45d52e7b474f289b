"""`pitstop launch`, `pitstop sysctl`, `pitstop monitor`: argument parsing only; the work is in the modules."""

from __future__ import annotations

import argparse

from pitstop.cliutil import add_output_args, command_after_dashes


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    _register_launch(sub)
    _register_sysctl(sub)
    _register_monitor(sub)


# ---------------------------------------------------------------- launch
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
    cpu = p.add_argument_group("CPU binding")
    cpu.add_argument("--ninstances", type=int, default=1, help="independent copies, each on its own cores")
    cpu.add_argument(
        "--ncores-per-instance", type=int, help="cores per instance / local rank (default: split all)"
    )
    cpu.add_argument(
        "--core-list", help="CPUs to use, e.g. 0-15,32-47 (default: one thread per physical core)"
    )
    cpu.add_argument("--node-id", type=int, help="use only this NUMA node's cores")
    cpu.add_argument("--use-logical-cores", action="store_true", help="also use hyper-thread siblings")
    cpu.add_argument(
        "--bind",
        default="auto",
        choices=("auto", "numactl", "taskset", "affinity", "none"),
        help="how to bind: auto = numactl if installed, else taskset, else sched_setaffinity",
    )
    cpu.add_argument(
        "--allocator",
        default="none",
        choices=("none", "auto", "jemalloc", "tcmalloc", "glibc"),
        help="LD_PRELOAD jemalloc or tcmalloc, or glibc: tune glibc malloc by environment to keep freed "
        "memory mapped (auto: jemalloc, else tcmalloc, else glibc)",
    )
    cpu.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="extra environment")
    cpu.add_argument("--log-dir", help="write each instance's output to DIR/instance_N.log")
    d = p.add_argument_group("torchrun (many processes, many nodes)")
    d.add_argument("--nproc-per-node", type=int, help="processes on this node (wraps torchrun)")
    d.add_argument("--nnodes", type=int, default=1)
    d.add_argument("--node-rank", type=int, default=0)
    d.add_argument(
        "--master-addr", help="rank-0 host; NCCL/GLOO_SOCKET_IFNAME is set to the interface reaching it"
    )
    d.add_argument("--master-port", type=int, default=29500)
    d.add_argument("--rdzv-endpoint", help="HOST:PORT for c10d rendezvous (instead of --master-addr)")
    d.add_argument("--rdzv-id", default="pitstop")
    p.add_argument("--dry-run", action="store_true", help="print the environment and commands, start nothing")
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="-- train.py ARGS  |  -- -m module ARGS")
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
def _register_sysctl(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "sysctl",
        help="kernel parameters that matter for training: current vs recommended, apply with consent",
        description=(
            "Show current vs recommended kernel parameters for training with the reason. --apply writes a "
            "sysctl.d drop-in (after confirmation; --yes to skip), keeping a backup; --revert restores it."
        ),
    )
    p.add_argument("--apply", action="store_true", help="write the recommended values to the drop-in file")
    p.add_argument("--revert", action="store_true", help="restore the state before the last --apply")
    p.add_argument("--path", default=None, help="drop-in file (default /etc/sysctl.d/90-pitstop.conf)")
    p.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")
    # Roots of the kernel trees read, for tests and containers with a mounted host /proc.
    p.add_argument("--proc-sys", default="/proc/sys", help=argparse.SUPPRESS)
    p.add_argument("--sys-root", default="/sys", help=argparse.SUPPRESS)
    add_output_args(p)
    p.set_defaults(func=cmd_sysctl)


def cmd_sysctl(args: argparse.Namespace) -> int:
    from pitstop.launch.sysctl_cli import run_sysctl

    return run_sysctl(args)


# ---------------------------------------------------------------- monitor
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
    p.add_argument("--interval", type=float, default=1.0, help="seconds between samples (default 1)")
    p.add_argument("--duration", type=float, help="stop after this many seconds")
    p.add_argument("--csv", metavar="FILE", help="append every sample to this CSV file")
    p.add_argument("--plot", metavar="CSV", help="draw a CSV written by --csv to a PNG and exit")
    p.add_argument("--out", metavar="PNG", help="PNG path for --plot (default: the CSV path with .png)")
    p.add_argument(
        "--low-util", type=float, default=70.0, help="GPU utilization threshold in %% (default 70)"
    )
    p.add_argument(
        "--window", type=float, default=30.0, help="seconds it must stay low to be flagged (default 30)"
    )
    p.add_argument("--command-log", metavar="FILE", help="keep the followed command's full output in FILE")
    p.add_argument("--no-live", action="store_true", help="no live screen (also off when not a terminal)")
    add_output_args(p, html=False)
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="-- COMMAND ARGS to start and follow")
    p.set_defaults(func=cmd_monitor)


def cmd_monitor(args: argparse.Namespace) -> int:
    from pitstop.launch.monitor_cli import run_monitor

    return run_monitor(args, command_after_dashes(args))
