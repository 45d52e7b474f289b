"""CPU probes: model and cores, ISA vs what torch dispatches to, oneDNN/OpenMP, threads, governor, NUMA."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pitstop.doctor.torchinfo import TorchBuild
from pitstop.findings import Finding, Severity
from pitstop.host.cpu import (
    FAST_BF16_FLAGS,
    affinity_cpus,
    cgroup_cpu_quota,
    cores_allowed,
    cpu_flags,
    cpu_model,
)
from pitstop.host.load import Competition, fitting_threads
from pitstop.host.sysfs import read_text
from pitstop.host.topology import SYS_CPU, Topology, numactl_path, read_topology
from pitstop.matmul import LowPrecision, cpu_bf16_line
from pitstop.recipes import recipe

# ISA levels torch's CPU kernels are compiled for, best first, with the /proc/cpuinfo flags each needs.
ISA_LEVELS = (
    ("AVX512", ("avx512f", "avx512bw", "avx512vl", "avx512dq")),
    ("AVX2", ("avx2", "fma")),
)


def check_model(
    topo: Topology,
    cpuinfo: str = "/proc/cpuinfo",
    affinity: int | None = None,
    quota: float | str | None = "read",
    cgroup_root: str = "/sys/fs/cgroup",
) -> list[Finding]:
    affinity = affinity_cpus() if affinity is None else affinity
    quota = cgroup_cpu_quota(cgroup_root) if quota == "read" else quota
    logical = len(topo.online_cpus)
    usable = cores_allowed(affinity, quota)
    data = {
        "model": cpu_model(cpuinfo),
        "logical_cpus": logical,
        "physical_cores": topo.physical_cores,
        "threads_per_core": round(logical / max(1, topo.physical_cores), 2),
        "affinity_cpus": affinity,
        "cgroup_quota_cpus": quota,
        "usable_cores": usable,
    }
    evidence = (
        f"{data['model']}: {logical} logical CPUs, {topo.physical_cores} physical cores; this process may use "
        f"{affinity} (affinity)" + (f", cgroup quota {quota:g} CPUs" if quota else ", no cgroup CPU quota")
    )
    if usable < logical:
        return [
            Finding(
                "cpu.model",
                Severity.INFO,
                f"{usable} of {logical} CPUs usable by this process",
                evidence,
                data,
                fix="Size threads and DataLoader workers from the usable count, not os.cpu_count() "
                "(pitstop.host.cpu.usable_cores()).",
            )
        ]
    return [Finding("cpu.model", Severity.PASS, f"{usable} CPUs usable", evidence, data)]


def check_isa(flags: frozenset[str], build: TorchBuild) -> list[Finding]:
    """The best ISA the CPU has vs the kernels torch picked (ATEN_CPU_CAPABILITY can lower it)."""
    best = next((name for name, need in ISA_LEVELS if all(f in flags for f in need)), "DEFAULT")
    extras = [
        f
        for f in ("avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8", "avx512_vnni")
        if f in flags
    ]
    cap = (build.cpu_capability or "?").upper()
    data = {"cpu_best": best, "torch_capability": cap, "extras": extras}
    evidence = (
        f"CPU supports {best}"
        + (f" (+{', '.join(extras)})" if extras else "")
        + f"; torch dispatches to {cap}"
    )
    order = {"DEFAULT": 0, "AVX2": 1, "AVX512": 2}
    if not flags:
        return [
            Finding(
                "cpu.isa",
                Severity.INFO,
                "CPU flags unreadable",
                evidence + "; /proc/cpuinfo gave no flags",
                data,
            )
        ]
    if cap in order and order[cap] < order[best]:
        return [
            Finding(
                "cpu.isa",
                Severity.WARN,
                f"torch uses {cap} kernels on a CPU with {best}",
                evidence,
                data,
                fix="Unset ATEN_CPU_CAPABILITY (it forces a lower level), or install an official torch wheel.",
                fix_code="unset ATEN_CPU_CAPABILITY",
            )
        ]
    return [
        Finding("cpu.isa", Severity.PASS, f"torch uses the CPU's best vector ISA ({cap})", evidence, data)
    ]


def check_bf16(flags: frozenset[str], check: LowPrecision | None = None) -> list[Finding]:
    """bf16 on this CPU from its flags and, when given, a bounded bf16-vs-fp32 torch.mm measurement; the
    evidence is the sentence bench prints about bf16 too (``pitstop.matmul.cpu_bf16_line``)."""
    fast = [f for f in FAST_BF16_FLAGS if f in flags]
    data: dict[str, Any] = {"fast_bf16_flags": fast}
    if check is not None:
        data.update(
            bf16_flops_per_s=check.peak.flops_per_s, fp32_flops_per_s=check.fp32.flops_per_s, n=check.peak.n
        )
    evidence = cpu_bf16_line(flags, check)
    if fast and not (check is not None and check.slower):
        return [
            Finding(
                "cpu.bf16",
                Severity.INFO,
                "CPU has bf16 hardware: bf16 autocast speeds up CPU training",
                evidence,
                data,
                fix="Train on the CPU under bf16 autocast (oneDNN uses the bf16 instructions); verify the speed-up "
                "with `pitstop bench`.",
                fix_code=recipe("amp").code(device="cpu", dtype="bfloat16"),
            )
        ]
    return [
        Finding(
            "cpu.bf16",
            Severity.INFO,
            "No bf16 hardware on this CPU: keep fp32 on the CPU"
            if not fast
            else "bf16 torch.mm measured slower than fp32 on this CPU: keep fp32 on the CPU",
            evidence,
            data,
            fix="bf16 autocast on this CPU is emulated and usually slower than fp32."
            if not fast
            else "Check that torch uses oneDNN (cpu.onednn) and ATEN_CPU_CAPABILITY is not lowered (cpu.isa).",
        )
    ]


def check_libraries(build: TorchBuild) -> list[Finding]:
    out = []
    if build.mkldnn:
        out.append(
            Finding(
                "cpu.onednn",
                Severity.PASS,
                f"oneDNN (MKL-DNN) {build.mkldnn_version or ''} in the build".replace("  ", " "),
                f"torch.backends.mkldnn.is_available()=True; MKL {'on' if build.mkl else 'off'}",
                {"mkldnn": True, "version": build.mkldnn_version, "mkl": build.mkl},
            )
        )
    else:
        out.append(
            Finding(
                "cpu.onednn",
                Severity.WARN,
                "torch built without oneDNN: CPU convolutions and bf16 matmuls are slow",
                "torch.backends.mkldnn.is_available()=False",
                {"mkldnn": False, "mkl": build.mkl},
                fix="Install the official x86-64 wheel from PyPI or download.pytorch.org (built with oneDNN).",
            )
        )
    out.append(
        Finding(
            "cpu.openmp",
            Severity.PASS if build.openmp else Severity.WARN,
            "OpenMP parallel backend"
            if build.openmp
            else "torch built without OpenMP: intra-op parallelism limited",
            f"torch.backends.openmp.is_available()={build.openmp}; ATen parallel backend: {build.parallel_backend}",
            {"openmp": build.openmp, "backend": build.parallel_backend},
            fix="" if build.openmp else "Install the official wheel (OpenMP backend).",
        )
    )
    return out


def check_threads(
    build: TorchBuild,
    topo: Topology,
    usable: int,
    env: Mapping[str, str],
    load: Competition | None = None,
) -> list[Finding]:
    """Intra-op threads vs the cores this process may use and, given ``load`` (what other work took of
    them, measured: ``host.load.measure_competition``), vs the cores left free; OMP_NUM_THREADS /
    MKL_NUM_THREADS."""
    n = build.num_threads
    phys = topo.physical_cores
    omp, mkl = env.get("OMP_NUM_THREADS"), env.get("MKL_NUM_THREADS")
    good = min(usable, phys) if phys else usable
    fit = min(good, fitting_threads(load.free_cores)) if load is not None else good
    data = {
        "torch_threads": n,
        "interop_threads": build.num_interop_threads,
        "usable_cores": usable,
        "physical_cores": phys,
        "OMP_NUM_THREADS": omp,
        "MKL_NUM_THREADS": mkl,
        "fit_threads": fit,
        "competition": load.to_dict() if load is not None else None,
    }
    evidence = (
        f"torch.get_num_threads()={n}, interop {build.num_interop_threads}; usable cores {usable}, physical "
        f"cores {phys}; OMP_NUM_THREADS={omp!r}, MKL_NUM_THREADS={mkl!r}"
        + (f"; {load.text()}" if load is not None else "")
    )
    out = []
    if load is not None and usable >= n > fit:
        out.append(_threads_over_free_cores(n, usable, fit, load, evidence, data))
    elif n > usable:
        out.append(
            Finding(
                "cpu.threads",
                Severity.WARN,
                f"{n} intra-op threads on {usable} usable cores: oversubscribed",
                evidence,
                data,
                fix=f"Use at most {fit} threads (one per usable physical core"
                + (", fewer while other work takes some" if fit < good else "")
                + "); with several processes per machine divide the cores between them (`pitstop launch` "
                "does this).",
                fix_code=f"export OMP_NUM_THREADS={fit}",
            )
        )
    elif n < max(1, fit // 2):
        out.append(
            Finding(
                "cpu.threads",
                Severity.INFO,
                f"{n} intra-op thread(s) while {fit} cores are usable" + (" and free" if fit < good else ""),
                evidence,
                data,
                fix="Right if several training processes share this machine; for one process use one thread "
                "per physical core.",
                fix_code=f"export OMP_NUM_THREADS={fit}",
            )
        )
    else:
        out.append(
            Finding(
                "cpu.threads",
                Severity.PASS,
                f"{n} intra-op threads for {usable} usable cores",
                evidence,
                data,
            )
        )
    out.append(_thread_env(omp, mkl))
    return out


def _threads_over_free_cores(
    n: int, usable: int, fit: int, load: Competition, evidence: str, data: dict[str, Any]
) -> Finding:
    """cpu.threads: threads that fit the usable cores but not those other work leaves free."""
    return Finding(
        "cpu.threads",
        Severity.WARN,
        f"{n} intra-op threads while other work leaves {load.free_cores:.1f} of {usable} usable cores free",
        evidence,
        data,
        fix=f"While the machine is this busy use {fit} thread{'s' if fit != 1 else ''} (a thread that loses "
        "its core stalls the others at every parallel region); `pitstop profile` measures what the threads "
        "cost your script (host.contention).",
        fix_code=f"export OMP_NUM_THREADS={fit}   # or torch.set_num_threads({fit})",
    )


def _thread_env(omp: str | None, mkl: str | None) -> Finding:
    """cpu.thread_env: OMP_NUM_THREADS / MKL_NUM_THREADS malformed, inconsistent, set or not."""
    bad_env = {}
    for name, value in (("OMP_NUM_THREADS", omp), ("MKL_NUM_THREADS", mkl)):
        if value is None:
            continue
        try:
            if int(value) < 1:
                raise ValueError
        except ValueError:
            bad_env[name] = value
    if omp is not None and mkl is not None and omp != mkl and not bad_env:
        bad_env["MKL_NUM_THREADS"] = f"{mkl} (differs from OMP_NUM_THREADS={omp})"
    if bad_env:
        return Finding(
            "cpu.thread_env",
            Severity.WARN,
            "Thread environment variables malformed or inconsistent",
            ", ".join(f"{k}={v!r}" for k, v in bad_env.items()),
            {"bad": bad_env},
            fix="Set OMP_NUM_THREADS (and MKL_NUM_THREADS, if set) to the same positive integer.",
        )
    return Finding(
        "cpu.thread_env",
        Severity.PASS if omp or mkl else Severity.INFO,
        "Thread environment variables consistent" if omp or mkl else "OMP_NUM_THREADS not set: torch picks",
        f"OMP_NUM_THREADS={omp!r}, MKL_NUM_THREADS={mkl!r}",
        {"OMP_NUM_THREADS": omp, "MKL_NUM_THREADS": mkl},
        fix=""
        if omp or mkl
        else "Fine for one process; set it per process when several share the machine (torchrun sets 1).",
    )


def check_governor(cpu_root: str | os.PathLike[str] = SYS_CPU) -> list[Finding]:
    base = Path(cpu_root)
    govs: dict[str, int] = {}
    driver = read_text(base / "cpu0" / "cpufreq" / "scaling_driver")
    for d in base.glob("cpu[0-9]*"):
        g = read_text(d / "cpufreq" / "scaling_governor")
        if g:
            govs[g] = govs.get(g, 0) + 1
    data = {"governors": govs, "driver": driver}
    if not govs:
        return [
            Finding(
                "cpu.governor",
                Severity.INFO,
                "No CPU frequency scaling visible (virtual machine or container)",
                f"no readable {base}/cpu*/cpufreq/scaling_governor",
                data,
                fix="Nothing to do here; on bare metal check the BIOS power profile.",
            )
        ]
    ev = f"scaling_governor: {', '.join(f'{g} x{n}' for g, n in sorted(govs.items()))}; driver {driver}"
    if set(govs) == {"performance"}:
        return [Finding("cpu.governor", Severity.PASS, "CPU governor: performance", ev, data)]
    # intel_pstate / amd-pstate "powersave" still boosts under load; acpi-cpufreq powersave pins the minimum.
    pinned_low = "powersave" in govs and driver not in ("intel_pstate", "amd-pstate", "amd-pstate-epp")
    return [
        Finding(
            "cpu.governor",
            Severity.WARN if pinned_low else Severity.INFO,
            "CPU governor holds the lowest frequency" if pinned_low else "CPU governor is not 'performance'",
            ev,
            data,
            fix="Set the performance governor for training runs (data loading and the CPU side of each step "
            "get faster; costs power).",
            fix_code="sudo cpupower frequency-set -g performance",
        )
    ]


def check_numa(topo: Topology, numactl: str | bool | None = True) -> list[Finding]:
    path = numactl_path() if numactl is True else (numactl or None)
    nodes = len(topo.nodes)
    data = {
        "nodes": nodes,
        "cpus_per_node": {n.id: len(n.cpus) for n in topo.nodes},
        "numactl": path,
    }
    ev = f"{nodes} NUMA node(s): " + "; ".join(f"node {n.id}: {len(n.cpus)} CPUs" for n in topo.nodes)
    out = [
        Finding(
            "cpu.numa",
            Severity.INFO if nodes > 1 else Severity.PASS,
            f"{nodes} NUMA nodes: bind each training process to one" if nodes > 1 else "Single NUMA node",
            ev,
            data,
            fix="Run one process per node bound to its CPUs and memory (`pitstop launch` does it); remote memory "
            "costs bandwidth."
            if nodes > 1
            else "",
        )
    ]
    out.append(
        Finding(
            "cpu.numactl",
            Severity.PASS if path else (Severity.WARN if nodes > 1 else Severity.INFO),
            f"numactl installed ({path})" if path else "numactl not installed",
            f"`numactl` on PATH: {path or 'not found'}; {nodes} NUMA node(s)",
            {"numactl": path},
            fix=""
            if path
            else "Install it to bind memory as well as CPUs (apt-get install numactl / dnf install numactl)"
            + ("." if nodes > 1 else "; with one NUMA node it is optional."),
        )
    )
    return out


def read_cpu_facts() -> tuple[Topology, frozenset[str]]:
    return read_topology(), cpu_flags()
