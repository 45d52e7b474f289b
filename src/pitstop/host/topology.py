"""CPU topology: NUMA nodes, their CPUs, physical cores vs hyper-threads, numactl. Read from sysfs.

One place for this concept: doctor reports it, launch binds by it.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from pitstop.host.sysfs import read_text

SYS_CPU = "/sys/devices/system/cpu"
SYS_NODE = "/sys/devices/system/node"


def parse_cpulist(text: str) -> list[int]:
    """Kernel cpulist ``0-3,8,10-11`` -> [0, 1, 2, 3, 8, 10, 11]. Raises ValueError on malformed input."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        if sep:
            a, b = int(lo), int(hi)
            if b < a:
                raise ValueError(f"bad cpu range {part!r}")
            cpus.update(range(a, b + 1))
        else:
            cpus.add(int(lo))
    if any(c < 0 for c in cpus):
        raise ValueError(f"negative cpu in {text!r}")
    return sorted(cpus)


def format_cpulist(cpus: list[int] | set[int]) -> str:
    """[0, 1, 2, 3, 8] -> ``0-3,8`` (the form numactl and taskset take)."""
    out: list[str] = []
    s = sorted(set(cpus))
    i = 0
    while i < len(s):
        j = i
        while j + 1 < len(s) and s[j + 1] == s[j] + 1:
            j += 1
        out.append(str(s[i]) if i == j else f"{s[i]}-{s[j]}")
        i = j + 1
    return ",".join(out)


@dataclass(frozen=True)
class NumaNode:
    id: int
    cpus: tuple[int, ...]
    mem_total_kb: int | None


@dataclass(frozen=True)
class Topology:
    online_cpus: tuple[int, ...]
    nodes: tuple[NumaNode, ...]
    # physical core id -> its logical CPUs (hyper-thread siblings), keyed by (package, core)
    cores: tuple[tuple[int, ...], ...]

    @property
    def physical_cores(self) -> int:
        return len(self.cores)

    def first_thread_per_core(self) -> list[int]:
        return sorted(c[0] for c in self.cores)

    def node_of(self, cpu: int) -> int | None:
        return next((n.id for n in self.nodes if cpu in n.cpus), None)


def read_topology(
    cpu_root: str | os.PathLike[str] = SYS_CPU, node_root: str | os.PathLike[str] = SYS_NODE
) -> Topology:
    """Read online CPUs, NUMA nodes and core siblings. A missing sysfs gives one node with os.cpu_count() CPUs."""
    online_text = read_text(Path(cpu_root, "online"))
    try:
        online = parse_cpulist(online_text) if online_text else list(range(os.cpu_count() or 1))
    except ValueError:
        online = list(range(os.cpu_count() or 1))
    nodes: list[NumaNode] = []
    node_dir = Path(node_root)
    if node_dir.is_dir():
        for d in sorted(node_dir.glob("node[0-9]*"), key=lambda p: int(p.name[4:])):
            try:
                cpus = parse_cpulist(read_text(d / "cpulist") or "")
            except ValueError:
                continue
            nodes.append(NumaNode(int(d.name[4:]), tuple(cpus), _node_mem_kb(d)))
    if not nodes:
        nodes = [NumaNode(0, tuple(online), None)]
    groups: dict[tuple[int, int], list[int]] = {}
    for cpu in online:
        base = Path(cpu_root, f"cpu{cpu}", "topology")
        pkg = read_text(base / "physical_package_id")
        core = read_text(base / "core_id")
        key = (
            (int(pkg), int(core))
            if pkg and core and pkg.lstrip("-").isdigit() and core.isdigit()
            else (-1, cpu)
        )
        groups.setdefault(key, []).append(cpu)
    cores = tuple(tuple(sorted(v)) for _, v in sorted(groups.items(), key=lambda kv: min(kv[1])))
    return Topology(tuple(online), tuple(nodes), cores)


def _node_mem_kb(node_dir: Path) -> int | None:
    text = read_text(node_dir / "meminfo")
    for line in (text or "").splitlines():
        if "MemTotal:" in line:
            try:
                return int(line.split("MemTotal:")[1].split()[0])
            except (IndexError, ValueError):
                return None
    return None


def numactl_path() -> str | None:
    return shutil.which("numactl")
