"""Which NUMA node each NVIDIA GPU hangs off, from sysfs, so a rank can be bound next to its GPU.

On a two-socket, 8-GPU machine a rank on the far socket pays a cross-socket hop for every
host-to-device copy and for its pinned-memory staging. Read without NVML or CUDA (the launcher
must not initialise CUDA before torchrun forks its workers).
"""

from __future__ import annotations

import os
import re
from collections.abc import Collection, Mapping
from pathlib import Path

from pitstop.host.sysfs import read_int, read_text
from pitstop.host.topology import Topology
from pitstop.launch.binding import Slot, candidate_cpus, plan_slots

NVIDIA_DRIVER = "/sys/bus/pci/drivers/nvidia"
_PCI_ADDR = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


def nvidia_gpu_nodes(root: str | os.PathLike[str] = NVIDIA_DRIVER) -> list[int | None]:
    """NUMA node of each GPU bound to the nvidia driver, in PCI bus order (NVML's index order, and
    CUDA's with CUDA_DEVICE_ORDER=PCI_BUS_ID). None where the kernel does not know (-1)."""
    d = Path(root)
    if not d.is_dir():
        return []
    nodes: list[int | None] = []
    for dev in sorted(p for p in d.iterdir() if _PCI_ADDR.match(p.name)):
        cls = read_text(dev / "class") or ""
        if not cls.startswith("0x03"):  # display controllers only (not NVSwitch bridges)
            continue
        node = read_int(dev / "numa_node")
        nodes.append(node if node is not None and node >= 0 else None)
    return nodes


def visible_gpu_nodes(gpu_nodes: list[int | None], environ: Mapping[str, str]) -> list[int | None] | None:
    """GPU nodes in the order local ranks see devices (CUDA_VISIBLE_DEVICES as indices), or None if unknown."""
    cvd = environ.get("CUDA_VISIBLE_DEVICES")
    if cvd is None:
        return gpu_nodes
    ids = [x.strip() for x in cvd.split(",") if x.strip()]
    if not all(x.isdigit() and int(x) < len(gpu_nodes) for x in ids):
        return None  # UUIDs or MIG names: no reliable mapping from sysfs
    return [gpu_nodes[int(x)] for x in ids]


def plan_rank_slots(
    topo: Topology,
    nproc: int,
    gpu_nodes: list[int | None] | None,
    ncores_per_rank: int | None = None,
    core_list: str | None = None,
    node_id: int | None = None,
    use_logical_cores: bool = False,
    allowed: Collection[int] | None = None,
) -> tuple[list[Slot], str | None]:
    """Slots for ``nproc`` local ranks: rank r on CPUs of GPU r's NUMA node when that is known and the
    machine has several nodes; otherwise consecutive slots. Returns (slots, a note on what was done)."""
    consecutive = plan_slots(topo, nproc, ncores_per_rank, core_list, node_id, use_logical_cores, allowed)
    if len(topo.nodes) < 2 or not gpu_nodes or len(gpu_nodes) < nproc:
        return consecutive, None
    wanted = gpu_nodes[:nproc]
    if any(n is None for n in wanted):
        return consecutive, None
    cpus = candidate_cpus(topo, core_list, node_id, use_logical_cores, allowed)
    pools: dict[int, list[int]] = {}
    for c in cpus:
        if (n := topo.node_of(c)) is not None:
            pools.setdefault(n, []).append(c)
    slots: list[Slot | None] = [None] * nproc
    for node in sorted({n for n in wanted if n is not None}):
        ranks = [r for r, n in enumerate(wanted) if n == node]
        pool = pools.get(node, [])
        per = ncores_per_rank or len(pool) // len(ranks)
        if per < 1 or per * len(ranks) > len(pool):
            return (
                consecutive,
                f"not enough CPUs on GPU NUMA node {node} for {len(ranks)} ranks; split in order",
            )
        for i, r in enumerate(ranks):
            slots[r] = Slot(r, tuple(pool[i * per : (i + 1) * per]), (node,))
    note = "ranks bound next to their GPU: " + ", ".join(
        f"rank {r} -> node {n}" for r, n in enumerate(wanted)
    )
    return [s for s in slots if s is not None], note
