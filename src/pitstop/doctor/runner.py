"""Run every doctor probe, each guarded, into one Report; plus the machine inventory for the HTML page.

A probe that raises becomes an error finding ``<area>.probe_failed`` naming it, so one broken check never
hides the others. Ctrl-C stops between probes and returns what was measured so far.
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pitstop.doctor import cpu, cuda, gpu, memory, python_env, storage, storage_read
from pitstop.doctor import system as sysprobe
from pitstop.doctor.torchinfo import TorchBuild, read_torch_build
from pitstop.findings import Finding, Report, Severity
from pitstop.host.cpu import cpu_flags
from pitstop.host.load import Competition, measure_competition
from pitstop.host.memory import cgroup_memory_limit, read_meminfo
from pitstop.host.sysfs import read_text
from pitstop.host.topology import read_topology
from pitstop.matmul import low_precision
from pitstop.measure.clock import Stopwatch
from pitstop.units import MiB, gib

AREAS = ("gpu", "cuda", "cpu", "memory", "storage", "system", "python")


@dataclass
class DoctorOptions:
    """Inputs of one audit. The defaults read this machine; tests replace any of them."""

    data_path: str | os.PathLike[str] = "."
    allow_write: bool = True  # may write (and delete) a temp file under data_path for the read test
    read_seconds: float = 1.5
    read_bytes: int = 256 * MiB
    nvml_lib: Any | None = None  # a pynvml-like module; None: the real one
    build: TorchBuild | None = None  # None: read from the installed torch
    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    sys_root: str = "/sys"
    proc_root: str = "/proc"
    root: str = "/"
    load: Competition | None = None  # what other work takes of the CPUs; None: measured (half a second)


Probe = tuple[str, str, Callable[[], list[Finding]]]  # (area, name, thunk)


def _guard(area: str, name: str, fn: Callable[[], list[Finding]]) -> list[Finding]:
    try:
        return list(fn())
    except (KeyboardInterrupt, SystemExit):
        raise
    except Exception as e:
        tb = traceback.extract_tb(e.__traceback__)
        where = f" at {Path(tb[-1].filename).name}:{tb[-1].lineno}" if tb else ""
        return [
            Finding(
                f"{area}.probe_failed",
                Severity.ERROR,
                f"Check '{name}' failed to run",
                f"{type(e).__name__}: {e}{where}",
                {"probe": name, "exception": type(e).__name__},
                fix="This is a pitstop bug or an unexpected system: please report it with this message. "
                "The other checks are unaffected.",
            )
        ]


@dataclass
class _Facts:
    """Facts several probes share, each read when a probe first needs it."""

    opts: DoctorOptions
    data: str | os.PathLike[str]  # the data path (resolved when it is readable)
    _cache: dict[str, Any] = field(default_factory=dict)

    @property
    def cpuinfo(self) -> str:
        return str(Path(self.opts.proc_root, "cpuinfo"))

    def topology(self) -> Any:
        if "t" not in self._cache:
            sys_root = self.opts.sys_root
            self._cache["t"] = read_topology(
                Path(sys_root, "devices/system/cpu"), Path(sys_root, "devices/system/node")
            )
        return self._cache["t"]

    def flags(self) -> Any:
        return cpu_flags(self.cpuinfo)

    def cpu_model(self) -> list[Finding]:
        return cpu.check_model(
            self.topology(), self.cpuinfo, cgroup_root=str(Path(self.opts.sys_root, "fs/cgroup"))
        )

    def usable(self) -> int:
        return int(self.cpu_model()[0].data["usable_cores"])

    def walked(self) -> storage_read.Scan:  # one bounded walk of the data path, shared by the storage probes
        if "scan" not in self._cache:
            self._cache["scan"] = storage_read.scan(Path(self.data))
        return self._cache["scan"]

    def meminfo(self) -> Any:
        return read_meminfo(Path(self.opts.proc_root, "meminfo"))


def build_probes(opts: DoctorOptions, build: TorchBuild | None, inv: gpu.GpuInventory) -> list[Probe]:
    """Every probe that applies, in report order: GPU, CPU, memory, storage, system, then the checks of
    the torch build (CUDA, CPU libraries and threads) and of the Python environment."""
    path_ok = Path(opts.data_path).exists() and os.access(opts.data_path, os.R_OK)
    facts = _Facts(opts, Path(opts.data_path).resolve() if path_ok else opts.data_path)
    return [
        *_gpu_probes(build, inv),
        *_host_probes(opts, build, facts),
        *_storage_probes(opts, facts, path_ok),
        *_system_probes(opts),
        *_build_probes(opts, build, inv, facts),
    ]


def _gpu_probes(build: TorchBuild | None, inv: gpu.GpuInventory) -> list[Probe]:
    return [
        ("gpu", "presence", lambda: gpu.check_presence(inv, build)),
        ("gpu", "driver", lambda: gpu.check_nvml(inv)),
        ("gpu", "model", lambda: gpu.check_models(inv)),
        ("gpu", "settings", lambda: gpu.check_settings(inv)),
        ("gpu", "pcie", lambda: gpu.check_pcie(inv)),
        ("gpu", "busy", lambda: gpu.check_busy(inv)),
    ]


def _host_probes(opts: DoctorOptions, build: TorchBuild | None, facts: _Facts) -> list[Probe]:
    """The CPU and memory probes."""
    sys_root, proc = opts.sys_root, opts.proc_root
    return [
        ("cpu", "model", facts.cpu_model),
        ("cpu", "isa", lambda: cpu.check_isa(facts.flags(), build) if build else []),
        (
            "cpu",
            "bf16",
            lambda: cpu.check_bf16(facts.flags(), low_precision() if build and proc == "/proc" else None),
        ),
        ("cpu", "governor", lambda: cpu.check_governor(Path(sys_root, "devices/system/cpu"))),
        ("cpu", "numa", lambda: cpu.check_numa(facts.topology())),
        (
            "memory",
            "ram",
            lambda: memory.check_ram(facts.meminfo(), cgroup_memory_limit(Path(sys_root, "fs/cgroup"))),
        ),
        ("memory", "swap", lambda: memory.check_swap(facts.meminfo(), read_text(Path(proc, "swaps")))),
        ("memory", "thp", lambda: memory.check_thp(sys_root)),
        ("memory", "shm", lambda: memory.check_shm(Path(opts.root, "dev/shm"))),
        ("memory", "memlock", lambda: memory.check_memlock(sys_root=sys_root)),
    ]


def _storage_probes(opts: DoctorOptions, facts: _Facts, path_ok: bool) -> list[Probe]:
    """The data path's check; its device, free space, files and read speed only where it is readable."""
    data, proc = facts.data, opts.proc_root
    probes: list[Probe] = [("storage", "path", lambda: storage.check_path(data))]
    if path_ok:
        probes += [
            (
                "storage",
                "device",
                lambda: storage.check_device(
                    data, read_text(Path(proc, "self/mountinfo")) or "", opts.sys_root
                ),
            ),
            ("storage", "free_space", lambda: storage.check_free_space(data)),
            ("storage", "small_files", lambda: storage.check_small_files(data, walked=facts.walked())),
            (
                "storage",
                "read_speed",
                lambda: storage.check_read_speed(
                    data,
                    allow_write=opts.allow_write,
                    max_seconds=opts.read_seconds,
                    max_bytes=opts.read_bytes,
                    walked=facts.walked(),
                ),
            ),
        ]
    return probes


def _system_probes(opts: DoctorOptions) -> list[Probe]:
    """Limits, network buffers, NCCL, kernel, container and privileges; the CUDA environment variables."""
    env, proc = opts.env, opts.proc_root
    return [
        ("system", "fd_limits", lambda: sysprobe.check_fd_limits(proc_sys=Path(proc, "sys"))),
        ("system", "net_buffers", lambda: sysprobe.check_net_buffers(Path(proc, "sys"))),
        ("system", "nccl_env", lambda: sysprobe.check_nccl_env(env, Path(opts.sys_root, "class/net"))),
        ("system", "kernel", lambda: sysprobe.check_kernel()),
        ("system", "container", lambda: sysprobe.check_container(opts.root, env)),
        ("system", "privileges", lambda: sysprobe.check_privileges()),
        ("cuda", "env", lambda: cuda.check_env(env)),
    ]


def _build_probes(
    opts: DoctorOptions, build: TorchBuild | None, inv: gpu.GpuInventory, facts: _Facts
) -> list[Probe]:
    """The Python probes, and with a torch build its CUDA, CPU library and thread probes."""
    env = opts.env
    py = python_env.read_python()
    if build is None:
        return [
            ("python", "version", lambda: python_env.check_version(py)),
            ("python", "environment", lambda: python_env.check_environment(py, env)),
        ]
    return [
        ("cuda", "build", lambda: cuda.check_build(inv, build)),
        ("cuda", "driver_compat", lambda: cuda.check_driver_compat(inv, build)),
        ("cuda", "visible", lambda: cuda.check_cuda_usable(inv, build, env)),
        ("cuda", "arch", lambda: cuda.check_arch(build)),
        ("cuda", "cudnn_nccl", lambda: cuda.check_cudnn_nccl(inv, build)),
        ("cuda", "hints", lambda: cuda.check_precision_hints(inv, build)),
        ("cpu", "libraries", lambda: cpu.check_libraries(build)),
        (
            "cpu",
            "threads",
            lambda: cpu.check_threads(
                build, facts.topology(), facts.usable(), env, opts.load or measure_competition()
            ),
        ),
        ("python", "version", lambda: python_env.check_version(py)),
        ("python", "environment", lambda: python_env.check_environment(py, env)),
        ("python", "torchvision", lambda: python_env.check_torchvision(build)),
        ("python", "debug", lambda: python_env.check_debug(py, build, env)),
    ]


def run_doctor(
    opts: DoctorOptions | None = None, progress: Callable[[str, int, int], None] | None = None
) -> Report:
    """Audit the machine. ``progress(name, done, total)`` is called before each step (for a progress bar)."""
    opts = opts or DoctorOptions()
    report = Report("doctor", meta={"data_path": str(opts.data_path)})
    timings: dict[str, float] = {}
    total = Stopwatch()
    try:
        if progress:
            progress("torch build", 0, 1)
        step = Stopwatch()
        build = opts.build
        if build is None:
            try:
                build = read_torch_build()
            except Exception as e:  # torch missing or broken: still audit the rest
                report.add(
                    Finding(
                        "python.torch",
                        Severity.ERROR,
                        "torch cannot be imported",
                        f"{type(e).__name__}: {e}",
                        {"error": str(e)},
                        fix="Install torch into this environment: pip install torch",
                    )
                )
        timings["torch build"] = step.elapsed()
        if progress:
            progress("NVML", 0, 1)
        step = Stopwatch()
        inv = gpu.read_gpus(opts.nvml_lib, opts.sys_root)
        timings["nvml"] = step.elapsed()
        probes = build_probes(opts, build, inv)
        for i, (area, name, fn) in enumerate(probes):
            if progress:
                progress(f"{area}: {name}", i, len(probes))
            step = Stopwatch()
            report.add(*_guard(area, name, fn))
            timings[f"{area}.{name}"] = step.elapsed()
    except KeyboardInterrupt:
        report.error = f"interrupted after {len(timings)} steps; the findings so far are kept"
        report.meta["interrupted"] = True
    report.meta["seconds"] = round(total.elapsed(), 3)
    report.sections["doctor"] = {
        "inventory": summary(report.findings),
        "facts": inventory(report.findings),
        "probe_seconds": {k: round(v, 4) for k, v in timings.items()},
    }
    return report


def _flat(value: Any) -> Any:
    if isinstance(value, list | tuple):
        if all(isinstance(v, str | int | float | bool) or v is None for v in value):
            return ", ".join("–" if v is None else str(v) for v in value)
        return None  # nested records stay in the finding's data
    return value


def inventory(findings: list[Finding]) -> list[dict[str, Any]]:
    """The raw facts every check read, one row each (area, check, fact, value), from the findings' data."""
    rows = []
    order = {a: i for i, a in enumerate(AREAS)}
    for f in sorted(findings, key=lambda f: (order.get(f.area, 99), f.id)):
        for key, value in f.data.items():
            items = value.items() if isinstance(value, dict) else [(None, value)]
            for sub, v in items:
                v = _flat(v)
                if v is None or isinstance(v, dict) or v == "":
                    continue
                rows.append(
                    {
                        "area": f.area,
                        "check": f.id,
                        "fact": key if sub is None else f"{key}.{sub}",
                        "value": v,
                    }
                )
    return rows


def _gib(v: Any) -> str | None:
    return gib(v) if isinstance(v, int | float) else None


def summary(findings: list[Finding]) -> list[list[str]]:
    """The machine at a glance, [label, value] rows, from the facts the checks read (nothing re-measured)."""
    by = {f.id: f.data for f in findings}

    def get(fid: str, key: str) -> Any:
        return by.get(fid, {}).get(key)

    gpus = get("gpu.model", "gpus") or []
    speed = get("storage.read_speed", "mb_per_s")
    rows: list[tuple[str, Any]] = [
        ("CPU", get("cpu.model", "model")),
        (
            "Cores",
            get("cpu.model", "logical_cpus")
            and f"{get('cpu.model', 'logical_cpus')} logical, {get('cpu.model', 'physical_cores')} physical, "
            f"{get('cpu.model', 'usable_cores')} usable by this process",
        ),
        (
            "Vector ISA",
            get("cpu.isa", "cpu_best")
            and f"{get('cpu.isa', 'cpu_best')} {' '.join(get('cpu.isa', 'extras') or [])}; torch kernels: "
            f"{get('cpu.isa', 'torch_capability')}",
        ),
        ("NUMA nodes", get("cpu.numa", "nodes")),
        ("RAM", _gib(get("memory.ram", "total_bytes"))),
        (
            "Swap",
            "none" if get("memory.swap", "total_bytes") == 0 else _gib(get("memory.swap", "total_bytes")),
        ),
        ("/dev/shm", _gib(get("memory.shm", "size_bytes"))),
        (
            "GPU",
            "; ".join(f"{g['name']} ({_gib(g['memory_total_bytes'])})" for g in gpus)
            if gpus
            else ("none" if "gpu.presence" in by else None),
        ),
        (
            "NVIDIA driver",
            get("gpu.driver", "driver_version")
            and f"{get('gpu.driver', 'driver_version')} (CUDA {get('gpu.driver', 'cuda_driver_version')})",
        ),
        (
            "torch",
            get("cuda.build", "torch") and f"{get('cuda.build', 'torch')} ({get('cuda.build', 'build')})",
        ),
        ("cuDNN", get("cuda.cudnn", "version_text")),
        ("NCCL", get("cuda.nccl", "version") and ".".join(map(str, get("cuda.nccl", "version")))),
        ("torchvision", get("python.torchvision", "torchvision")),
        (
            "Python",
            get("python.version", "version")
            and f"{get('python.version', 'version')} ({get('python.environment', 'kind')})",
        ),
        ("Data path", get("storage.path", "path")),
        (
            "Filesystem",
            get("storage.filesystem", "fstype")
            and f"{get('storage.filesystem', 'fstype')} on {get('storage.filesystem', 'mount_point')}",
        ),
        (
            "Block device",
            get("storage.device", "name")
            and f"{get('storage.device', 'name')} ({get('storage.device', 'kind')})",
        ),
        (
            "Sequential read",
            speed is not None and f"{speed:.0f} MB/s ({get('storage.read_speed', 'method')})",
        ),
        ("Kernel", get("system.kernel", "release")),
        ("Container", get("system.container", "container") or ("none" if "system.container" in by else None)),
    ]
    return [[label, str(value)] for label, value in rows if value not in (None, False, "")]
