"""Turn launch options into exact processes (command + environment), print them, and run them.

``build_plan`` is pure given its inputs (topology, environment, tools found), so ``--dry-run`` shows the
very commands a real launch starts, and tests check them against a fake topology.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from pitstop.host.topology import Topology
from pitstop.launch.allocator import Allocator, preload_env, resolve_allocator
from pitstop.launch.binding import LaunchError, Slot, plan_slots, slots_to_env, thread_env
from pitstop.launch.gpu_numa import plan_rank_slots, visible_gpu_nodes
from pitstop.launch.netif import check_ifname, route_to_master

BIND_CHOICES = ("auto", "numactl", "taskset", "affinity", "none")
BOOTSTRAP = "pitstop.launch.bootstrap"


@dataclass
class LaunchOptions:
    command: list[str]
    ninstances: int = 1
    ncores_per_instance: int | None = None
    core_list: str | None = None
    node_id: int | None = None
    use_logical_cores: bool = False
    bind: str = "auto"
    allocator: str = "none"
    env: dict[str, str] = field(default_factory=dict)
    # torchrun
    nproc_per_node: int | None = None
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str | None = None
    master_port: int = 29500
    rdzv_endpoint: str | None = None
    rdzv_id: str = "pitstop"

    @property
    def distributed(self) -> bool:
        return self.nproc_per_node is not None or self.nnodes > 1 or self.rdzv_endpoint is not None


@dataclass
class Proc:
    """One process to start: argv, the environment entries pitstop sets on top of the caller's, and the
    CPUs pitstop binds it to itself (sched_setaffinity before exec) when no wrapper tool does it."""

    label: str
    argv: list[str]
    env: dict[str, str]
    affinity: tuple[int, ...] | None = None
    bound: bool = True


@dataclass
class LaunchPlan:
    procs: list[Proc]
    slots: list[Slot]
    notes: list[str] = field(default_factory=list)
    allocator: Allocator | None = None


@dataclass(frozen=True)
class Tools:
    """External tools found on this machine (None when absent)."""

    numactl: str | None
    taskset: str | None


def python_argv(command: Sequence[str], python: str = sys.executable) -> list[str]:
    """``train.py ARGS`` and ``-m pkg ARGS`` run with this Python; anything else runs as given."""
    if not command:
        raise LaunchError("no command given: pitstop launch [options] -- train.py ARGS")
    if command[0] == "-m":
        if len(command) < 2:
            raise LaunchError("-m needs a module name")
        return [python, *command]
    if command[0].endswith(".py"):
        return [python, *command]
    return list(command)


def script_argv(command: Sequence[str]) -> list[str]:
    """The Python target for torchrun (``script.py ARGS`` or ``-m mod ARGS``), dropping a leading python."""
    cmd = list(command)
    if cmd and Path(cmd[0]).name.startswith("python") and not cmd[0].endswith(".py"):
        cmd = cmd[1:]
    if not cmd:
        raise LaunchError("no command given: pitstop launch [options] -- train.py ARGS")
    if cmd[0] == "-m" and len(cmd) >= 2:
        return cmd
    if cmd[0].endswith(".py"):
        return cmd
    raise LaunchError(
        f"torchrun runs a Python script or module: give 'train.py ARGS' or '-m module ARGS', not {cmd[0]!r}"
    )


def _binder(bind: str, tools: Tools) -> str:
    if bind == "auto":
        return "numactl" if tools.numactl else "taskset" if tools.taskset else "affinity"
    if bind == "numactl" and not tools.numactl:
        raise LaunchError(
            "--bind numactl: numactl is not installed (apt install numactl / dnf install numactl); "
            "use --bind affinity to bind with sched_setaffinity instead"
        )
    if bind == "taskset" and not tools.taskset:
        raise LaunchError("--bind taskset: taskset is not installed (util-linux); use --bind affinity")
    if bind not in BIND_CHOICES:
        raise LaunchError(f"unknown --bind {bind!r} (choose {', '.join(BIND_CHOICES)})")
    return bind


def _prefix(binder: str, slot: Slot, tools: Tools, multi_node: bool) -> list[str]:
    if binder == "numactl":
        assert tools.numactl
        pre = [tools.numactl, f"--physcpubind={slot.cpulist}"]
        # Keep memory on the slot's node(s); only meaningful when the machine has several.
        if multi_node and slot.nodes:
            pre.append(f"--membind={','.join(map(str, slot.nodes))}")
        return pre
    if binder == "taskset":
        assert tools.taskset
        return [tools.taskset, "-c", slot.cpulist]
    return []


def build_plan(
    opts: LaunchOptions,
    topo: Topology,
    environ: Mapping[str, str],
    tools: Tools,
    allowed: Collection[int] | None = None,
    ldconfig: dict[str, str] | None = None,
    alloc_dirs: list[Path] | None = None,
    net: tuple[Mapping, Mapping] | None = None,
    gpu_nodes: list[int | None] | None = None,
    cpu_quota: float | None = None,
) -> LaunchPlan:
    """Everything a launch will start. Raises LaunchError for anything that cannot be done as asked.

    ``gpu_nodes``: NUMA node of each GPU in index order (gpu_numa.nvidia_gpu_nodes), for torchrun ranks.
    ``cpu_quota``: a cgroup CPU limit (hardware.cgroup_cpu_quota); more threads than it gets a note."""
    plan = _build(opts, topo, environ, tools, allowed, ldconfig, alloc_dirs, net, gpu_nodes)
    used = sum(len(s.cpus) for s in plan.slots)
    if cpu_quota is not None and used > cpu_quota:
        plan.notes.append(
            f"the cgroup CPU quota is {cpu_quota:g} CPUs but {used} threads are planned: they will be "
            "throttled; use --core-list or --ncores-per-instance to match the quota"
        )
    return plan


def _build(
    opts: LaunchOptions,
    topo: Topology,
    environ: Mapping[str, str],
    tools: Tools,
    allowed: Collection[int] | None,
    ldconfig: dict[str, str] | None,
    alloc_dirs: list[Path] | None,
    net: tuple[Mapping, Mapping] | None,
    gpu_nodes: list[int | None] | None,
) -> LaunchPlan:
    binder = _binder(opts.bind, tools)
    alloc, note = resolve_allocator(opts.allocator, ldconfig, alloc_dirs)
    notes = [note] if note else []
    common: dict[str, str] = {}
    if alloc:
        common.update(preload_env(alloc, dict(environ)))
    multi_numa = len(topo.nodes) > 1
    for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "GOMP_CPU_AFFINITY", "KMP_AFFINITY"):
        if k in environ and k not in opts.env:
            notes.append(f"your {k}={environ[k]} is replaced per process (force it with --env {k}=...)")
    for k, v in environ.items():
        if k.startswith("NCCL_") and k not in opts.env:
            notes.append(f"passing through {k}={v}")
    if opts.distributed:
        return _torchrun_plan(
            opts, topo, environ, tools, allowed, binder, common, notes, alloc, net, gpu_nodes
        )

    slots = plan_slots(
        topo,
        opts.ninstances,
        opts.ncores_per_instance,
        opts.core_list,
        opts.node_id,
        opts.use_logical_cores,
        allowed,
    )
    base = python_argv(opts.command)
    procs = []
    for s in slots:
        env = dict(common)
        if binder == "none":
            env.update({k: str(len(s.cpus)) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")})
        else:
            env.update(thread_env(s.cpus))
        env.update({"PITSTOP_INSTANCE": str(s.index), "PITSTOP_NINSTANCES": str(len(slots))})
        env.update(opts.env)
        procs.append(
            Proc(
                label=f"instance {s.index}",
                argv=_prefix(binder, s, tools, multi_numa) + base,
                env=env,
                affinity=s.cpus if binder == "affinity" else None,
                bound=binder != "none",
            )
        )
    return LaunchPlan(procs, slots, notes, alloc)


def _torchrun_plan(
    opts: LaunchOptions,
    topo: Topology,
    environ: Mapping[str, str],
    tools: Tools,
    allowed: Collection[int] | None,
    binder: str,
    common: dict[str, str],
    notes: list[str],
    alloc: Allocator | None,
    net: tuple[Mapping, Mapping] | None,
    gpu_nodes: list[int | None] | None,
) -> LaunchPlan:
    nproc = opts.nproc_per_node or 1
    if nproc < 1 or opts.nnodes < 1:
        raise LaunchError("--nproc-per-node and --nnodes must be at least 1")
    if not 0 <= opts.node_rank < opts.nnodes:
        raise LaunchError(f"--node-rank {opts.node_rank} must be in 0..{opts.nnodes - 1}")
    if opts.ninstances != 1:
        raise LaunchError("--ninstances starts independent copies; with torchrun use --nproc-per-node")
    target = script_argv(opts.command)
    # Split this node's CPUs among the local ranks so each rank's OpenMP threads and DataLoader
    # workers stay on their own cores instead of all ranks fighting over all cores; next to its GPU
    # when sysfs says where the GPUs are.
    visible = visible_gpu_nodes(gpu_nodes, environ) if gpu_nodes else None
    slots, note = plan_rank_slots(
        topo,
        nproc,
        visible,
        opts.ncores_per_instance,
        opts.core_list,
        opts.node_id,
        opts.use_logical_cores,
        allowed,
    )
    if note:
        notes.append(note)
    run, host, port = _rendezvous(opts)
    env = dict(common)
    if host is not None:
        env.update(_interface_env(opts, host, port, environ, net, notes))
    env["PITSTOP_RANK_CPUS"] = slots_to_env(slots)
    env["PITSTOP_BIND"] = "0" if binder == "none" else "1"
    env.update(opts.env)
    if binder in ("numactl", "taskset"):
        notes.append(
            "each rank binds itself with sched_setaffinity (numactl/taskset cannot wrap torchrun's workers)"
        )
    argv = [*run, "-m", BOOTSTRAP, *target]
    return LaunchPlan([Proc("torchrun", argv, env)], slots, notes, alloc)


def _rendezvous(opts: LaunchOptions) -> tuple[list[str], str | None, int]:
    """The torchrun command up to the script, the master's host (None for a local rendezvous) and port:
    c10d rendezvous with ``--rdzv-endpoint``, a static master with ``--master-addr``, else standalone."""
    run = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(opts.nproc_per_node or 1)]
    host: str | None = None
    port = opts.master_port
    if opts.rdzv_endpoint:
        host, _, p = opts.rdzv_endpoint.rpartition(":")
        host = host.strip("[]")  # [::1]:29400
        if not host or not p.isdigit():
            raise LaunchError(f"--rdzv-endpoint must be HOST:PORT (got {opts.rdzv_endpoint!r})")
        port = int(p)
        run += ["--nnodes", str(opts.nnodes), "--rdzv-backend", "c10d"]
        run += ["--rdzv-endpoint", opts.rdzv_endpoint, "--rdzv-id", opts.rdzv_id]
    elif opts.master_addr:
        host = opts.master_addr
        run += ["--nnodes", str(opts.nnodes), "--node-rank", str(opts.node_rank)]
        run += ["--master-addr", opts.master_addr, "--master-port", str(opts.master_port)]
    elif opts.nnodes == 1:
        run += ["--standalone"]  # local rendezvous on a free port
    else:
        raise LaunchError("--nnodes > 1 needs --master-addr (and --master-port) or --rdzv-endpoint")
    return run, host, port


def _interface_env(
    opts: LaunchOptions,
    host: str,
    port: int,
    environ: Mapping[str, str],
    net: tuple[Mapping, Mapping] | None,
    notes: list[str],
) -> dict[str, str]:
    """NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME set to the interface of the route to the master, unless
    given (then checked to exist); a loopback master with several nodes is an error."""
    env: dict[str, str] = {}
    addrs, stats = net if net is not None else (None, None)
    route = route_to_master(host, port, addrs, stats)
    if route.loopback and opts.nnodes > 1:
        raise LaunchError(f"master {host} is a loopback address but --nnodes is {opts.nnodes}")
    for var in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"):
        if var in environ or var in opts.env:
            given = opts.env.get(var, environ.get(var, ""))
            if missing := check_ifname(given, addrs):
                raise LaunchError(f"{var}={given}: no interface {', '.join(missing)} on this machine")
            notes.append(f"keeping {var}={given} (the route to {host} is via {route.interface})")
        elif not route.loopback:
            env[var] = route.interface
    if not route.loopback:
        notes.append(
            f"master {host} ({route.master_ip}) is reached via {route.interface} ({route.source_ip})"
        )
    return env


def describe(plan: LaunchPlan) -> str:
    """The exact commands and environment, one shell line per process (copy-pasteable)."""
    lines = [f"# {n}" for n in plan.notes]
    for i, p in enumerate(plan.procs):
        if p.label == "torchrun":
            ranks = ", ".join(f"rank {s.index}: {s.cpulist}" for s in plan.slots)
            lines.append(f"# torchrun, local rank CPUs {ranks}")
        else:
            how = " (sched_setaffinity by pitstop)" if p.affinity is not None else ""
            how = how if p.bound else " (threads only, not bound: --bind none)"
            lines.append(f"# {p.label}: CPUs {plan.slots[i].cpulist}{how}")
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in p.env.items())
        lines.append(f"env {env} {shlex.join(p.argv)}" if env else shlex.join(p.argv))
    return "\n".join(lines)


def _preexec(cpus: tuple[int, ...] | None) -> Callable[[], None] | None:
    if cpus is None:
        return None

    def bind() -> None:
        os.sched_setaffinity(0, cpus)

    return bind


def run_plan(plan: LaunchPlan, log_dir: str | None = None, err: IO[str] | None = None) -> int:
    """Start every process, wait for all, return the first non-zero exit code (128+N for signal N).

    On Ctrl-C the children (which got it too) have a moment to finish, e.g. a checkpoint save; then
    pitstop sends SIGINT to the rest, then kills what is still running after 30 s.
    """
    err = err or sys.stderr
    children: list[tuple[Proc, subprocess.Popen[bytes]]] = []
    logs = []
    try:
        for p in plan.procs:
            out = None
            if log_dir:
                Path(log_dir).mkdir(parents=True, exist_ok=True)
                out = open(Path(log_dir, p.label.replace(" ", "_") + ".log"), "wb")  # noqa: SIM115
                logs.append(out)
            try:
                child = subprocess.Popen(
                    p.argv,
                    env={**os.environ, **p.env},
                    preexec_fn=_preexec(p.affinity),
                    stdout=out,
                    stderr=subprocess.STDOUT if out else None,
                )
            except (OSError, subprocess.SubprocessError) as e:
                print(f"pitstop launch: cannot start {p.label} ({p.argv[0]}): {e}", file=err)
                _stop(children, signalled=False)
                return 127
            children.append((p, child))
        codes = [c.wait() for _, c in children]
    except KeyboardInterrupt:
        _stop(children)
        return 130
    finally:
        for f in logs:
            f.close()
    if len(children) > 1:
        for (p, _), rc in zip(children, codes, strict=True):
            if rc != 0:
                print(f"pitstop launch: {p.label} exited with {rc}", file=err)
    bad = [rc for rc in codes if rc != 0]
    if not bad:
        return 0
    return 128 - bad[0] if bad[0] < 0 else bad[0]


def _stop(children: list[tuple[Proc, subprocess.Popen[bytes]]], signalled: bool = True) -> None:
    """Stop the children gently. After a terminal Ctrl-C they got SIGINT already (same process group):
    give them a moment to exit on their own before sending one more, so a checkpoint save in a
    SIGINT handler is not interrupted twice. Then SIGINT, then kill."""
    running = [c for _, c in children if c.poll() is None]
    if signalled:
        running = [c for c in running if not _waited(c, 5.0)]
    for c in running:
        with contextlib.suppress(OSError):
            c.send_signal(signal.SIGINT)
    for c in running:
        if not _waited(c, 30.0):
            c.kill()
            c.wait()


def _waited(c: subprocess.Popen[bytes], timeout: float) -> bool:
    try:
        c.wait(timeout=timeout)
        return True
    except subprocess.TimeoutExpired:
        return False
