"""GPU probes: is there an NVIDIA GPU (PCI bus, NVML, torch.cuda), what is it, and how is it set up."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pitstop.doctor.torchinfo import TorchBuild
from pitstop.findings import Finding, Severity
from pitstop.host.nvml import GpuInfo, GpuSample, Nvml, NvmlUnavailable
from pitstop.host.precision import gpu_has_tensor_cores
from pitstop.host.sysfs import read_text
from pitstop.units import gib

NVIDIA_PCI_VENDOR = "0x10de"
GPU_PCI_CLASSES = ("0x0300", "0x0302")  # VGA controller, 3D controller
HW_SLOWDOWNS = {"hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown", "sw_thermal_slowdown"}


@dataclass
class GpuInventory:
    """What NVML said, read once and shared by the gpu and cuda probes."""

    nvml_ok: bool
    reason: str | None = None  # why NVML could not be used
    driver_version: str | None = None
    cuda_driver_version: str | None = None
    gpus: list[GpuInfo] = field(default_factory=list)
    samples: list[GpuSample] = field(default_factory=list)
    pci_gpus: list[str] = field(default_factory=list)  # NVIDIA GPUs on the PCI bus, driver or not


def pci_nvidia_gpus(sys_root: str | os.PathLike[str] = "/sys") -> list[str]:
    """PCI addresses of NVIDIA display/3D controllers: the hardware, whether or not a driver is loaded."""
    base = Path(sys_root, "bus", "pci", "devices")
    found = []
    try:
        devices = sorted(base.iterdir())
    except OSError:
        return []
    for d in devices:
        if read_text(d / "vendor") == NVIDIA_PCI_VENDOR and (read_text(d / "class") or "").startswith(
            GPU_PCI_CLASSES
        ):
            found.append(d.name)
    return found


def read_gpus(lib: Any | None = None, sys_root: str | os.PathLike[str] = "/sys") -> GpuInventory:
    """Query NVML (``lib`` None: the real pynvml) and the PCI bus. Never raises for a missing GPU stack."""
    pci = pci_nvidia_gpus(sys_root)
    try:
        with Nvml(lib) as nv:
            n = nv.device_count()
            inv = GpuInventory(True, None, nv.driver_version(), nv.cuda_driver_version(), pci_gpus=pci)
            for i in range(n):
                inv.gpus.append(nv.info(i))
                inv.samples.append(nv.sample(i))
            return inv
    except NvmlUnavailable as e:
        return GpuInventory(False, e.reason, pci_gpus=pci)


def check_presence(inv: GpuInventory, build: TorchBuild | None) -> list[Finding]:
    """``build`` None: torch could not be imported (python.torch says so); judge from NVML and PCI alone."""
    cuda_ok = bool(build and build.cuda_available)
    count = build.device_count if build else 0
    data = {
        "nvml": inv.nvml_ok,
        "nvml_reason": inv.reason,
        "nvml_gpus": len(inv.gpus),
        "pci_nvidia_gpus": len(inv.pci_gpus),
        "torch_cuda_available": cuda_ok,
        "torch_device_count": count,
    }
    evidence = (
        f"NVML: {f'{len(inv.gpus)} GPU(s)' if inv.nvml_ok else f'unavailable ({inv.reason})'}; "
        f"PCI bus: {len(inv.pci_gpus)} NVIDIA GPU(s); "
        + (f"torch.cuda.is_available()={cuda_ok}" if build else "torch not importable")
        + (f" ({count} device(s))" if cuda_ok else "")
    )
    if inv.gpus and cuda_ok:
        names = ", ".join(sorted({g.name or "?" for g in inv.gpus}))
        return [
            Finding("gpu.presence", Severity.PASS, f"{len(inv.gpus)} GPU(s) usable: {names}", evidence, data)
        ]
    if inv.gpus or cuda_ok:
        # One side sees GPUs, the other does not: cuda.* findings say why (build, driver, visibility).
        return [
            Finding(
                "gpu.presence",
                Severity.WARN,
                "GPU seen by NVML but not usable from torch"
                if inv.gpus
                else "torch sees a GPU that NVML does not",
                evidence,
                data,
                fix="See the cuda.* findings below for the cause (torch build, driver, CUDA_VISIBLE_DEVICES).",
            )
        ]
    if inv.pci_gpus:
        return [
            Finding(
                "gpu.presence",
                Severity.ERROR,
                "NVIDIA GPU on the PCI bus but no working driver",
                evidence + f"; PCI addresses {', '.join(inv.pci_gpus)}",
                data,
                fix="Install or load the NVIDIA driver (nvidia-smi must work), then re-run pitstop doctor.",
                fix_code="nvidia-smi  # must list the GPU; if not: install the driver package for your distro",
            )
        ]
    return [
        Finding(
            "gpu.presence",
            Severity.INFO,
            "No NVIDIA GPU: training runs on the CPU",
            evidence,
            data,
            fix="Nothing to fix for CPU training; see the cpu.* findings. For GPU training, use a machine with "
            "an NVIDIA GPU and driver.",
        )
    ]


def check_nvml(inv: GpuInventory) -> list[Finding]:
    data = {"available": inv.nvml_ok, "reason": inv.reason, "driver_version": inv.driver_version}
    if inv.nvml_ok:
        return [
            Finding(
                "gpu.driver",
                Severity.PASS,
                f"NVIDIA driver {inv.driver_version} (supports CUDA {inv.cuda_driver_version})",
                f"NVML: driver {inv.driver_version}, highest CUDA the driver supports {inv.cuda_driver_version}",
                {**data, "cuda_driver_version": inv.cuda_driver_version},
            )
        ]
    sev = Severity.ERROR if inv.pci_gpus else Severity.INFO
    return [
        Finding(
            "gpu.driver",
            sev,
            "NVML unavailable: no GPU details or monitoring"
            if inv.pci_gpus
            else "NVML unavailable (no NVIDIA driver)",
            f"NVML: {inv.reason}",
            data,
            fix="Install the NVIDIA driver (it ships libnvidia-ml.so.1) and `pip install nvidia-ml-py`."
            if inv.pci_gpus
            else "Expected on a machine without an NVIDIA GPU; nothing to fix.",
        )
    ]


def check_models(inv: GpuInventory) -> list[Finding]:
    if not inv.gpus:
        return []
    rows = [
        f"GPU {g.index}: {g.name}, {gib(g.memory_total_bytes)}, compute capability "
        f"{'.'.join(map(str, g.compute_capability)) if g.compute_capability else '?'}"
        for g in inv.gpus
    ]
    data = {
        "gpus": [
            {
                "index": g.index,
                "name": g.name,
                "uuid": g.uuid,
                "memory_total_bytes": g.memory_total_bytes,
                "compute_capability": g.compute_capability,
            }
            for g in inv.gpus
        ]
    }
    old = [g for g in inv.gpus if g.compute_capability and not gpu_has_tensor_cores(g.compute_capability)]
    if old:
        return [
            Finding(
                "gpu.model",
                Severity.WARN,
                "GPU without tensor cores (compute capability < 7.0): mixed precision gains little",
                "; ".join(rows),
                data,
                fix="Expect fp16 autocast to save memory but not much time on this GPU; bf16/TF32 need 8.0+.",
            )
        ]
    return [
        Finding(
            "gpu.model", Severity.PASS, f"{len(inv.gpus)} GPU(s) with tensor cores", "; ".join(rows), data
        )
    ]


def check_settings(inv: GpuInventory) -> list[Finding]:
    """Persistence mode, ECC, clocks and power limit: what NVML reports per GPU."""
    if not inv.gpus:
        return []
    return [_persistence_finding(inv), _ecc_finding(inv), *_power_limit_findings(inv), _clocks_finding(inv)]


def _persistence_finding(inv: GpuInventory) -> Finding:
    """Persistence mode per GPU: off means every new process pays the driver start-up."""
    off = [g.index for g in inv.gpus if g.persistence_mode is False]
    known = [g for g in inv.gpus if g.persistence_mode is not None]
    pm_ev = (
        ", ".join(f"GPU {g.index}: {'on' if g.persistence_mode else 'off'}" for g in known) or "not reported"
    )
    return Finding(
        "gpu.persistence",
        Severity.WARN if off else (Severity.PASS if known else Severity.INFO),
        "Persistence mode off: each new process pays the driver start-up"
        if off
        else ("Persistence mode on" if known else "Persistence mode not reported by NVML"),
        f"NVML persistence mode: {pm_ev}",
        {"off": off, "reported": len(known)},
        fix="Turn it on so the driver stays loaded between runs (or run nvidia-persistenced)." if off else "",
        fix_code="sudo nvidia-smi -pm 1" if off else None,
    )


def _ecc_finding(inv: GpuInventory) -> Finding:
    """ECC mode per GPU, where NVML reports it."""
    ecc = ", ".join(
        f"GPU {g.index}: {'on' if g.ecc_enabled else 'off'}" for g in inv.gpus if g.ecc_enabled is not None
    )
    return Finding(
        "gpu.ecc",
        Severity.INFO,
        "ECC memory " + ("reported" if ecc else "not supported on this GPU"),
        f"NVML ECC mode: {ecc or 'not supported'}",
        {"ecc": {g.index: g.ecc_enabled for g in inv.gpus}},
        fix="Keep ECC on for long training runs: it costs a few % of memory and bandwidth on GDDR GPUs "
        "(none on HBM) and prevents silent corruption."
        if ecc
        else "",
    )


def _power_limit_findings(inv: GpuInventory) -> list[Finding]:
    """A power limit set below the board default (a warning), else the limits at their defaults (none
    where NVML reports no default)."""
    capped = {
        g.index: (g.power_limit_w, g.power_limit_default_w)
        for g in inv.gpus
        if g.power_limit_w and g.power_limit_default_w and g.power_limit_w < 0.95 * g.power_limit_default_w
    }
    if capped:
        return [
            Finding(
                "gpu.power_limit",
                Severity.WARN,
                "GPU power limit set below the board default: clocks drop under load",
                "; ".join(
                    f"GPU {i}: limit {lim:.0f} W, default {dflt:.0f} W" for i, (lim, dflt) in capped.items()
                ),
                {"capped": {i: [lim, dflt] for i, (lim, dflt) in capped.items()}},
                fix="Restore the default limit unless the cap is deliberate (shared power budget, cooling).",
                fix_code="\n".join(
                    f"sudo nvidia-smi -i {i} -pl {dflt:.0f}" for i, (_, dflt) in capped.items()
                ),
            )
        ]
    if any(g.power_limit_default_w for g in inv.gpus):
        return [
            Finding(
                "gpu.power_limit",
                Severity.PASS,
                "GPU power limits at their defaults",
                "; ".join(
                    f"GPU {g.index}: limit {g.power_limit_w or 0:.0f} W, default {g.power_limit_default_w:.0f} W"
                    for g in inv.gpus
                    if g.power_limit_default_w
                ),
                {"limits": {g.index: [g.power_limit_w, g.power_limit_default_w] for g in inv.gpus}},
            )
        ]
    return []


def _clocks_finding(inv: GpuInventory) -> Finding:
    """Max and current clocks, temperature and power per GPU; a warning when a thermal or power slowdown
    holds the clocks down."""
    clocks = "; ".join(
        f"GPU {g.index}: max SM {g.sm_clock_max_mhz or '?'} MHz, max memory {g.mem_clock_max_mhz or '?'} MHz, "
        f"power limit {f'{g.power_limit_w:.0f} W' if g.power_limit_w is not None else '?'}"
        for g in inv.gpus
    )
    now = "; ".join(
        f"GPU {s.index}: SM {s.sm_clock_mhz or '?'} MHz, {s.temperature_c if s.temperature_c is not None else '?'} C, "
        f"{f'{s.power_w:.0f} W' if s.power_w is not None else '? W'}, clock limited by: "
        f"{', '.join(s.clock_reasons) or 'nothing' if s.clock_reasons is not None else 'not reported'}"
        for s in inv.samples
    )
    # Slowdowns that mean hardware trouble (cooling, power delivery), not a busy or idle GPU.
    held = {s.index: sorted(set(s.clock_reasons or []) & HW_SLOWDOWNS) for s in inv.samples}
    held = {i: r for i, r in held.items() if r}
    data = {
        "max": {g.index: [g.sm_clock_max_mhz, g.mem_clock_max_mhz, g.power_limit_w] for g in inv.gpus},
        "now": {s.index: [s.sm_clock_mhz, s.temperature_c, s.power_w] for s in inv.samples},
        "clock_reasons": {s.index: s.clock_reasons for s in inv.samples},
        "slowdown": held,
    }
    if held:
        return Finding(
            "gpu.clocks",
            Severity.WARN,
            "GPU clocks held down by a thermal or power slowdown",
            f"{clocks}. Now: {now}",
            data,
            fix="Check cooling (fans, airflow, inlet temperature) and power cabling/PSU; nvidia-smi -q -d "
            "PERFORMANCE shows the active slowdowns. Every step runs slower until this clears.",
            fix_code="nvidia-smi -q -d PERFORMANCE,TEMPERATURE,POWER",
        )
    return Finding(
        "gpu.clocks",
        Severity.INFO,
        "GPU clocks and power limit",
        f"{clocks}. Now (idle or under someone's load): {now}",
        data,
        fix="Watch these under load with `pitstop monitor`: clocks far below max while busy mean power or "
        "thermal throttling.",
    )


def check_pcie(inv: GpuInventory) -> list[Finding]:
    if not inv.gpus:
        return []
    rows, narrow, slow_gen = [], [], []
    for g in inv.gpus:
        rows.append(f"GPU {g.index}: gen {g.pcie_gen}/{g.pcie_gen_max} x{g.pcie_width}/x{g.pcie_width_max}")
        if g.pcie_width and g.pcie_width_max and g.pcie_width < g.pcie_width_max:
            narrow.append(g.index)
        if g.pcie_gen and g.pcie_gen_max and g.pcie_gen < g.pcie_gen_max:
            slow_gen.append(g.index)
    data = {
        "links": {g.index: [g.pcie_gen, g.pcie_gen_max, g.pcie_width, g.pcie_width_max] for g in inv.gpus},
        "narrow": narrow,
        "below_max_gen": slow_gen,
    }
    evidence = "PCIe link current/max: " + "; ".join(rows)
    if narrow:
        return [
            Finding(
                "gpu.pcie",
                Severity.WARN,
                "GPU PCIe link narrower than it can run: host-to-device copies are slower",
                evidence,
                data,
                fix="Check the slot (x16 wanted), risers and BIOS bifurcation settings.",
            )
        ]
    if slow_gen:
        return [
            Finding(
                "gpu.pcie",
                Severity.INFO,
                "GPU PCIe link below its top generation (normal at idle: GPUs lower it to save power)",
                evidence,
                data,
                fix="Re-check while training (nvidia-smi -q -d PCI); if it stays low under load, check the slot "
                "and BIOS PCIe settings.",
            )
        ]
    return [Finding("gpu.pcie", Severity.PASS, "GPU PCIe links at full generation and width", evidence, data)]


def check_busy(inv: GpuInventory, own_pid: int | None = None) -> list[Finding]:
    """Other processes holding GPU memory or compute slow training or make it run out of memory."""
    if not inv.samples:
        return []
    own_pid = os.getpid() if own_pid is None else own_pid
    rows, busy = [], []
    for s in inv.samples:
        others = [p for p in (s.processes or []) if p != own_pid]
        used = s.mem_used_bytes or 0
        total = s.mem_total_bytes or 0
        rows.append(
            f"GPU {s.index}: {gib(used)} of {gib(total)} used, utilisation "
            f"{s.util_gpu_pct if s.util_gpu_pct is not None else '?'}%, processes {others if s.processes is not None else '?'}"
        )
        if others or (total and used / total > 0.10) or (s.util_gpu_pct or 0) > 10:
            busy.append(s.index)
    data = {"busy": busy, "samples": [vars(s) for s in inv.samples]}
    if busy:
        return [
            Finding(
                "gpu.busy",
                Severity.WARN,
                "GPU already in use by other processes",
                "; ".join(rows),
                data,
                fix="Stop the other jobs or pick a free GPU with CUDA_VISIBLE_DEVICES; shared GPUs give noisy "
                "timings and out-of-memory errors.",
            )
        ]
    return [
        Finding("gpu.busy", Severity.PASS, "GPUs idle: nothing else is using them", "; ".join(rows), data)
    ]
