"""How many DataLoader workers: the one answer ``profile``, ``fix``, ``tune loader`` and ``--verify`` give.

The count is a function of the machine and, where there are some, of measurements:

- **the cores a process may use** (affinity and cgroup quota, ``host.cpu.usable_cores``), less the cores
  **other processes** kept busy when that was measured (a run's ``other_cpu_share``);
- **the training processes sharing them** (a node's local ranks, ``torch.multiprocessing`` children): each
  one's loader gets its share;
- **torch's suggested maximum**: DataLoader warns above the CPUs in the affinity mask, so no answer
  exceeds it (nor ``MAX_WORKERS``; this is the *cap*);
- without measurements, **one core stays with the training process** (its forward and backward run on
  the same cores as the workers): the default is the process's share less one, at least 1;
- with a **measured curve** (throughput by worker count: ``tune loader``'s sweep, ``fix``'s runs), the
  fewest workers within ``min_gain`` of the fastest count at or under the cap. A faster count above the
  cap is reported, never chosen: torch warns there, and a loader-only sweep does not see the workers
  take the cores from the training step.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from pitstop.host.cpu import affinity_cpus, usable_cores

MAX_WORKERS = 8  # past this, more workers mostly cost memory and start-up on the machines we see


@dataclass(frozen=True)
class WorkerMachine:
    """What decides the worker count on one machine.

    cores:      cores the training process may use (affinity and cgroup quota).
    torch_max:  torch's suggested maximum for one DataLoader (the CPUs in the affinity mask).
    ranks:      training processes that share those cores, each with its own loader.
    other_busy: cores other processes kept busy, measured; None where it was not measured.
    """

    cores: int
    torch_max: int
    ranks: int = 1
    other_busy: float | None = None

    @classmethod
    def here(cls, ranks: int = 1, other_cpu_share: float | None = None) -> WorkerMachine:
        """This machine; ``other_cpu_share``: other processes' share of all its CPUs (a run's measured
        ``other_cpu_share``), taken as spread evenly, so that share of the usable cores is theirs."""
        cores = usable_cores()
        busy = None if other_cpu_share is None else other_cpu_share * cores
        return cls(cores, affinity_cpus(), max(1, ranks), busy)

    @classmethod
    def of_run(cls, data: Mapping[str, Any] | None = None, cores: int | None = None) -> WorkerMachine:
        """This machine as one profiled run saw it: from its ``data`` (``pitstop.profile.runs.runner``'s
        ``RunResult.data``) the other processes' measured CPU share and the local ranks; ``cores``: the
        usable cores where the caller knows them (else this process's)."""
        d = data or {}
        ranks = int((d.get("distributed") or {}).get("local_world_size") or 1)
        m = cls.here(ranks=ranks, other_cpu_share=d.get("other_cpu_share"))
        if cores is None:
            return m
        # a process's usable cores never exceed its affinity: a count given here (a rank's) is taken as is
        return replace(m, cores=cores, torch_max=max(m.torch_max, cores))


@dataclass(frozen=True)
class WorkerChoice:
    """The worker count, the most the machine allows, and why, in words."""

    workers: int
    cap: int
    basis: str
    measured: bool = False
    faster_above_cap: int | None = None  # a measured count above the cap that was faster, not chosen


def free_cores(m: WorkerMachine) -> int:
    """Cores left to one training process: the usable cores less other processes' (rounded to whole
    cores; all of them busy still leaves one), split between the ranks."""
    busy = round(m.other_busy) if m.other_busy is not None else 0
    left = max(1, m.cores - min(busy, m.cores - 1))
    return max(1, left // max(1, m.ranks))


def worker_cap(m: WorkerMachine) -> int:
    """The most workers any command recommends for one process's loader."""
    return max(1, min(free_cores(m), m.torch_max, MAX_WORKERS))


def _machine_text(m: WorkerMachine) -> str:
    parts = [f"{m.cores} usable cores"]
    if m.other_busy is not None and round(m.other_busy) > 0:
        parts.append(f"about {round(m.other_busy)} kept busy by other processes")
    if m.ranks > 1:
        parts.append(f"shared by {m.ranks} training processes")
    return ", ".join(parts) + f"; torch suggests at most {m.torch_max} workers per loader"


def choose_workers(
    m: WorkerMachine, measured: Mapping[int, float] | None = None, min_gain: float = 0.03
) -> WorkerChoice:
    """The DataLoader worker count for ``m``; ``measured``: throughput (any unit, higher is faster) by
    worker count, where it was measured. See the module docstring for the rule."""
    cap = worker_cap(m)
    machine = _machine_text(m)
    curve = {int(w): float(r) for w, r in (measured or {}).items() if r and r > 0}
    within = {w: r for w, r in curve.items() if w <= cap}
    if not within:
        n = max(1, min(cap, free_cores(m) - 1))
        return WorkerChoice(n, cap, f"{machine}: one core left to the training process")
    best = max(within.values())
    n = min(w for w, r in within.items() if r * (1 + min_gain) >= best)
    above = [w for w, r in curve.items() if w > cap and r > best * (1 + min_gain)]
    why = (
        f"{machine}: the fewest workers within {min_gain:.0%} of the fastest measured count at or under {cap}"
    )
    if above:
        why += f" ({min(above)} measured faster but exceeds the cap)"
    return WorkerChoice(n, cap, why, True, min(above) if above else None)


__all__ = ["MAX_WORKERS", "WorkerChoice", "WorkerMachine", "choose_workers", "free_cores", "worker_cap"]
