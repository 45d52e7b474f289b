"""System probes: file descriptor limits, network buffers, the NCCL environment, kernel, container, root."""

from __future__ import annotations

import os
import platform
import resource
from collections.abc import Mapping
from pathlib import Path

from pitstop.findings import Finding, Severity
from pitstop.host.cpu import cpu_flags
from pitstop.host.sysfs import PROC_SYS, read_sysctl, read_text
from pitstop.launch import sysctl as sc

MIN_NOFILE = 4096  # DataLoader workers with the file_descriptor sharing strategy hold an fd per shared tensor


def check_fd_limits(
    limits: tuple[int, int] | None = None, proc_sys: str | os.PathLike[str] = PROC_SYS
) -> list[Finding]:
    soft, hard = limits if limits is not None else resource.getrlimit(resource.RLIMIT_NOFILE)
    inf = resource.RLIM_INFINITY
    file_max = read_sysctl("fs.file-max", proc_sys)

    def fmt(v: int) -> str:
        return "unlimited" if v == inf else str(v)

    data = {
        "soft": None if soft == inf else soft,
        "hard": None if hard == inf else hard,
        "file_max": file_max,
    }
    ev = f"ulimit -n: soft {fmt(soft)}, hard {fmt(hard)}; fs.file-max {file_max or 'unreadable'}"
    out = []
    if soft != inf and soft < MIN_NOFILE:
        can = hard == inf or hard >= MIN_NOFILE
        out.append(
            Finding(
                "system.fd_limit",
                Severity.WARN,
                f"Open-file limit {soft}: DataLoader workers can hit 'Too many open files'",
                ev,
                data,
                fix="Raise the soft limit"
                + (" (the hard limit allows it)" if can else "; the hard limit needs root (limits.conf)")
                + ", or use torch.multiprocessing.set_sharing_strategy('file_system').",
                fix_code=f"ulimit -n {fmt(hard) if can and hard != inf else 65536}",
            )
        )
    else:
        out.append(Finding("system.fd_limit", Severity.PASS, f"Open-file limit {fmt(soft)}", ev, data))
    check = sc.assess(sc.param("fs.file-max"), file_max)  # `pitstop sysctl`'s rule and verdict
    fmax = int(file_max) if check.ok is not None and file_max else None
    out.append(
        Finding(
            "system.file_max",
            sc.verdict(check),
            f"System-wide open files: {file_max}" if fmax else "fs.file-max unreadable",
            f"fs.file-max={file_max}; rule {check.recommended} (as `pitstop sysctl`)",
            {"file_max": fmax},
            fix=f"sudo sysctl -w fs.file-max={check.write}" if check.write else "",
        )
    )
    return out


def check_net_buffers(proc_sys: str | os.PathLike[str] = PROC_SYS) -> list[Finding]:
    """Only multi-node jobs care: NCCL over TCP sockets is capped by these on fast links. Judged by
    ``pitstop sysctl``'s rule for each (``sysctl.verdict``), so both commands say the same."""
    checks = [
        sc.assess(sc.param(n), read_sysctl(n, proc_sys)) for n in ("net.core.rmem_max", "net.core.wmem_max")
    ]
    vals = {c.name: c.current for c in checks}
    ev = ", ".join(f"{k}={v}" for k, v in vals.items())
    sev = max((sc.verdict(c) for c in checks), key=lambda v: v.rank)
    if any(c.ok is None for c in checks):
        return [
            Finding(
                "system.net_buffers", Severity.INFO, "Socket buffer limits unreadable", ev, {"values": vals}
            )
        ]
    if sev is not Severity.PASS:
        rule = checks[0].recommended
        return [
            Finding(
                "system.net_buffers",
                sev,
                "Socket buffers small for multi-node training over TCP",
                f"{ev} (rule {rule}, as `pitstop sysctl`); matters only for multi-node jobs without InfiniBand",
                {"values": vals},
                fix="For multi-node NCCL over Ethernet raise them (`pitstop sysctl --apply`).",
                fix_code=f"sudo sysctl -w net.core.rmem_max={sc.param('net.core.rmem_max').value} "
                f"net.core.wmem_max={sc.param('net.core.wmem_max').value}",
            )
        ]
    return [Finding("system.net_buffers", Severity.PASS, "Socket buffers large enough", ev, {"values": vals})]


def _ifname_matches(spec: str, interfaces: list[str]) -> tuple[bool, list[str]]:
    """NCCL_SOCKET_IFNAME syntax: prefixes 'eth,ib'; '^' excludes; '=' means exact names."""
    spec = spec.strip()
    exclude = spec.startswith("^")
    spec = spec.lstrip("^")
    exact = spec.startswith("=")
    names = [s for s in spec.lstrip("=").split(",") if s]

    def hit(i: str) -> bool:
        return any(i == n if exact else i.startswith(n) for n in names)

    chosen = [i for i in interfaces if (not hit(i) if exclude else hit(i))]
    return bool(chosen), chosen


def check_nccl_env(
    env: Mapping[str, str], net_root: str | os.PathLike[str] = "/sys/class/net"
) -> list[Finding]:
    nccl = {k: v for k, v in env.items() if k.startswith("NCCL_")}
    try:
        interfaces = sorted(p.name for p in Path(net_root).iterdir())
    except OSError:
        interfaces = []
    data = {"nccl_env": nccl, "interfaces": interfaces}
    problems, notes = [], []
    ifname = nccl.get("NCCL_SOCKET_IFNAME")
    if ifname is not None:
        ok, chosen = _ifname_matches(ifname, interfaces)
        data["socket_interfaces"] = chosen
        if not ok:
            problems.append(
                f"NCCL_SOCKET_IFNAME={ifname!r} matches no interface (have {', '.join(interfaces)})"
            )
        else:
            notes.append(f"NCCL_SOCKET_IFNAME={ifname!r} selects {', '.join(chosen)}")
    for key, why in (
        ("NCCL_P2P_DISABLE", "GPU peer-to-peer copies off: intra-node all-reduce goes through host memory"),
        ("NCCL_IB_DISABLE", "InfiniBand off: multi-node traffic falls back to TCP"),
        ("NCCL_SHM_DISABLE", "shared-memory transport off"),
    ):
        if nccl.get(key, "0").strip() == "1":
            problems.append(f"{key}=1: {why}")
    if nccl.get("NCCL_DEBUG", "").upper() in ("INFO", "TRACE"):
        notes.append(f"NCCL_DEBUG={nccl['NCCL_DEBUG']} (verbose logs; fine while debugging)")
    ev = (
        "; ".join(problems + notes)
        if problems or notes
        else f"{len(nccl)} NCCL_* variable(s) set; interfaces: {', '.join(interfaces) or 'unreadable'}"
    )
    if problems:
        return [
            Finding(
                "system.nccl_env",
                Severity.WARN,
                "NCCL environment disables fast paths or names a missing interface",
                ev,
                data,
                fix="Unset the *_DISABLE variables unless a hardware problem needs them; set NCCL_SOCKET_IFNAME "
                "to an interface from `ip link` (prefix match, e.g. 'eth' or '^lo,docker').",
            )
        ]
    return [Finding("system.nccl_env", Severity.PASS, "NCCL environment sane", ev, data)]


def check_kernel(release: str | None = None) -> list[Finding]:
    release = release or platform.release()
    parts = release.split(".")
    try:
        ver = (int(parts[0]), int("".join(c for c in parts[1] if c.isdigit()) or 0))
    except (ValueError, IndexError):
        ver = None
    data = {"release": release}
    if ver is not None and ver < (4, 15):
        return [
            Finding(
                "system.kernel",
                Severity.WARN,
                f"Old kernel {release}",
                f"uname -r: {release} (< 4.15)",
                data,
                fix="Recent NVIDIA drivers and io_uring/overlay features need a newer kernel; upgrade the OS.",
            )
        ]
    return [Finding("system.kernel", Severity.PASS, f"Linux {release}", f"uname -r: {release}", data)]


def detect_container(
    root: str | os.PathLike[str] = "/", env: Mapping[str, str] | None = None
) -> tuple[str | None, list[str]]:
    """('docker' | 'podman' | 'kubernetes' | 'lxc' | None, the clues found)."""
    env = os.environ if env is None else env
    r = Path(root)
    clues = []
    kind = None
    if (r / ".dockerenv").exists():
        kind, clues = "docker", [*clues, "/.dockerenv"]
    if (r / "run" / ".containerenv").exists():
        kind, clues = "podman", [*clues, "/run/.containerenv"]
    if "KUBERNETES_SERVICE_HOST" in env:
        kind, clues = "kubernetes", [*clues, "KUBERNETES_SERVICE_HOST"]
    cg = read_text(r / "proc" / "1" / "cgroup") or ""
    for word in ("docker", "kubepods", "containerd", "lxc", "libpod"):
        if word in cg:
            clues.append(f"/proc/1/cgroup mentions {word}")
            kind = kind or {"kubepods": "kubernetes", "libpod": "podman", "containerd": "containerd"}.get(
                word, word
            )
    if env.get("container"):
        clues.append(f"container={env['container']}")
        kind = kind or env["container"]
    return kind, clues


def check_container(
    root: str | os.PathLike[str] = "/", env: Mapping[str, str] | None = None
) -> list[Finding]:
    kind, clues = detect_container(root, env)
    vm = "hypervisor" in cpu_flags(Path(root, "proc", "cpuinfo"))  # the CPUID bit a hypervisor sets
    data = {"container": kind, "clues": clues, "virtual_machine": vm}
    ev = (f"container: {kind} ({'; '.join(clues)})" if kind else "no container markers") + (
        "; CPU flags show a hypervisor (virtual machine)" if vm else ""
    )
    if kind:
        return [
            Finding(
                "system.container",
                Severity.INFO,
                f"Running in a container ({kind})",
                ev,
                data,
                fix="Containers limit /dev/shm, CPUs and locked memory by default: see memory.shm, cpu.model and "
                "memory.memlock; for GPUs use --gpus all and --ipc=host.",
            )
        ]
    return [
        Finding(
            "system.container",
            Severity.PASS,
            "Not in a container" + (" (virtual machine)" if vm else ""),
            ev,
            data,
        )
    ]


def check_privileges(euid: int | None = None) -> list[Finding]:
    euid = os.geteuid() if euid is None else euid
    data = {"euid": euid, "root": euid == 0}
    if euid == 0:
        return [
            Finding(
                "system.privileges",
                Severity.INFO,
                "Running as root",
                "effective uid 0",
                data,
                fix="Fine for auditing; pitstop still changes nothing without an explicit flag.",
            )
        ]
    return [
        Finding(
            "system.privileges",
            Severity.INFO,
            "Not root: some fixes need sudo",
            f"effective uid {euid}; sysctl, governor and THP changes need root, everything here was read without it",
            data,
            fix="Run the printed fix commands with sudo where they say so.",
        )
    ]
