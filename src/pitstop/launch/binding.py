"""Which CPUs each launched process gets, and the thread/affinity environment that goes with them.

Pure planning from a Topology: nothing here starts a process or changes affinity, so dry-runs and
tests use exactly the code a real launch uses.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from pitstop.host.topology import Topology, format_cpulist, parse_cpulist


class LaunchError(ValueError):
    """A launch that cannot be done as asked (bad core list, too many instances, missing tool). Exit 2."""


@dataclass(frozen=True)
class Slot:
    """The CPUs of one process (an instance, or a local rank under torchrun) and their NUMA nodes."""

    index: int
    cpus: tuple[int, ...]
    nodes: tuple[int, ...]

    @property
    def cpulist(self) -> str:
        return format_cpulist(list(self.cpus))


def candidate_cpus(
    topo: Topology,
    core_list: str | None = None,
    node_id: int | None = None,
    use_logical_cores: bool = False,
    allowed: Collection[int] | None = None,
) -> list[int]:
    """The CPUs a launch may use, ordered by NUMA node then id.

    An explicit ``core_list`` is taken as given (logical CPU ids) and must exist and be allowed; otherwise
    one thread per physical core (hyper-thread siblings share a core's FP units, so OpenMP threads on both
    mostly slow each other down), restricted to ``node_id`` and to ``allowed`` (this process's affinity).
    """
    online = set(topo.online_cpus)
    if node_id is not None and node_id not in {n.id for n in topo.nodes}:
        have = ", ".join(str(n.id) for n in topo.nodes)
        raise LaunchError(f"NUMA node {node_id} does not exist on this machine (nodes: {have})")
    if core_list is not None:
        try:
            cpus = parse_cpulist(core_list)
        except ValueError as e:
            raise LaunchError(f"cannot parse core list {core_list!r}: {e}") from None
        if not cpus:
            raise LaunchError(f"core list {core_list!r} is empty")
        missing = [c for c in cpus if c not in online]
        if missing:
            raise LaunchError(
                f"CPUs {format_cpulist(missing)} in --core-list are not online on this machine "
                f"(online: {format_cpulist(list(online))})"
            )
        if allowed is not None and (denied := [c for c in cpus if c not in allowed]):
            raise LaunchError(
                f"CPUs {format_cpulist(denied)} in --core-list are outside this process's allowed CPUs "
                f"({format_cpulist(list(allowed))}; a container or cgroup limit)"
            )
        if node_id is not None and (other := [c for c in cpus if topo.node_of(c) != node_id]):
            raise LaunchError(f"CPUs {format_cpulist(other)} in --core-list are not on NUMA node {node_id}")
    else:
        cpus = sorted(online) if use_logical_cores else topo.first_thread_per_core()
        if node_id is not None:
            cpus = [c for c in cpus if topo.node_of(c) == node_id]
        if allowed is not None:
            cpus = [c for c in cpus if c in allowed]
        if not cpus:
            raise LaunchError("no usable CPUs left after applying --node-id and this process's affinity")
    return sorted(cpus, key=lambda c: (topo.node_of(c) if topo.node_of(c) is not None else -1, c))


def plan_slots(
    topo: Topology,
    ninstances: int = 1,
    ncores_per_instance: int | None = None,
    core_list: str | None = None,
    node_id: int | None = None,
    use_logical_cores: bool = False,
    allowed: Collection[int] | None = None,
) -> list[Slot]:
    """Split the candidate CPUs into ``ninstances`` consecutive, disjoint slots.

    Consecutive in node order, so a slot only spans two NUMA nodes when the split forces it.
    """
    if ninstances < 1:
        raise LaunchError(f"--ninstances must be at least 1 (got {ninstances})")
    cpus = candidate_cpus(topo, core_list, node_id, use_logical_cores, allowed)
    if ninstances > len(cpus):
        raise LaunchError(
            f"{ninstances} instances but only {len(cpus)} CPUs to bind them to ({format_cpulist(cpus)}); "
            "use fewer instances, --use-logical-cores, or a larger --core-list"
        )
    per = ncores_per_instance if ncores_per_instance is not None else len(cpus) // ninstances
    if per < 1:
        raise LaunchError(f"--ncores-per-instance must be at least 1 (got {per})")
    if per * ninstances > len(cpus):
        raise LaunchError(
            f"{ninstances} instances x {per} cores needs {per * ninstances} CPUs but only {len(cpus)} "
            f"are available ({format_cpulist(cpus)})"
        )
    slots = []
    for i in range(ninstances):
        mine = tuple(sorted(cpus[i * per : (i + 1) * per]))
        nodes = tuple(sorted({n for c in mine if (n := topo.node_of(c)) is not None}))
        slots.append(Slot(i, mine, nodes))
    return slots


def thread_env(cpus: tuple[int, ...] | list[int]) -> dict[str, str]:
    """OpenMP/MKL thread count and thread pinning for a process bound to ``cpus``.

    One thread per bound CPU: more oversubscribes, fewer leaves cores idle. GOMP_CPU_AFFINITY pins
    libgomp's threads (PyTorch's default OpenMP); KMP_AFFINITY does the same for Intel's libiomp.
    """
    n = str(len(cpus))
    cl = format_cpulist(list(cpus))
    return {
        "OMP_NUM_THREADS": n,
        "MKL_NUM_THREADS": n,
        "GOMP_CPU_AFFINITY": cl,
        "KMP_AFFINITY": f"granularity=fine,proclist=[{cl}],explicit",
    }


def slots_to_env(slots: list[Slot]) -> str:
    """Encode per-rank CPU slots for the torchrun bootstrap: ``0-3;4-7``."""
    return ";".join(s.cpulist for s in slots)


def slot_from_env(env: Mapping[str, str], local_rank: int) -> list[int] | None:
    """The CPUs of ``local_rank`` from PITSTOP_RANK_CPUS, or None when pitstop did not assign any."""
    text = env.get("PITSTOP_RANK_CPUS")
    if not text:
        return None
    parts = text.split(";")
    if not 0 <= local_rank < len(parts):
        return None
    return parse_cpulist(parts[local_rank]) or None
