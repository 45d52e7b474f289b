"""One rank's summary in a launch (``runs.merge.rank_summary``), typed: what the cross-rank rules
(``analyze.dist_rules``) read and the report's ``ranks`` section writes (``to_json``). A ``record.base.Record``:
a key it does not name is kept in ``extra``, a null the summary wrote is written again."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pitstop.profile.record.base import Record

NO_NAMES: frozenset[str] = frozenset()


@dataclass(frozen=True)
class RankBreakdown(Record):
    """The rank's measured steps: mean and median step, and the mean seconds of each part of a step."""

    mean_step_s: float = 0.0
    median_step_s: float = 0.0
    data_wait_s: float | None = None
    h2d_s: float | None = None
    forward_s: float | None = None
    backward_s: float | None = None
    optimizer_s: float | None = None
    sync_s: float | None = None
    other_s: float | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    nulls: frozenset[str] = field(default=NO_NAMES, compare=False, repr=False)

    def part(self, name: str) -> float:
        """Mean seconds per step of the part ``name`` (``forward_s``, ...; 0 where not measured)."""
        v = getattr(self, name, None) if name in _PARTS else self.extra.get(name)
        return float(v or 0.0)


_PARTS = frozenset({"data_wait_s", "h2d_s", "forward_s", "backward_s", "optimizer_s", "sync_s", "other_s"})


@dataclass(frozen=True)
class CommPerStep(Record):
    """The rank's communication per measured step (``rank.comm``): blocking collectives, DDP's gradient
    reduction (its time, the part exposed after the last bucket was ready, rounds and bytes), the search
    for unused parameters."""

    collective_s: float = 0.0
    ddp_comm_s: float = 0.0
    ddp_exposed_s: float = 0.0
    ddp_rounds: float = 0.0
    ddp_timed_rounds: float | None = None
    unused_search_s: float = 0.0
    ddp_bytes: float = 0.0
    extra: Mapping[str, Any] = field(default_factory=dict)
    nulls: frozenset[str] = field(default=NO_NAMES, compare=False, repr=False)

    @property
    def wait_s(self) -> float:
        """Time blocked in collectives per step: DDP's exposed all-reduce and blocking collectives."""
        return self.ddp_exposed_s + self.collective_s


@dataclass(frozen=True)
class RankSummary(Record):
    """One rank: its status, where it ran, its breakdown (None where no step was measured), its
    communication, its DDP models and collective sites, its process facts and last state."""

    ONE: ClassVar[dict[str, type[Record]]] = {"breakdown": RankBreakdown, "comm_per_step": CommPerStep}

    rank: int = 0
    status: str | None = None
    error: str | None = None
    host: str | None = None
    local_rank: int | None = None
    node_rank: int | None = None
    world_size: int | None = None
    measured_steps: int = 0
    breakdown: RankBreakdown | None = None
    comm_per_step: CommPerStep = field(default_factory=CommPerStep)
    steps: list[dict[str, Any]] = field(default_factory=list)
    comm_steps: dict[str, Any] = field(default_factory=dict)
    collective_sites: list[dict[str, Any]] = field(default_factory=list)
    ddp: list[dict[str, Any]] = field(default_factory=list)
    backend: str | None = None
    devices: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    process: dict[str, Any] = field(default_factory=dict)
    signal: Any = None
    state: Any = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    nulls: frozenset[str] = field(default=NO_NAMES, compare=False, repr=False)

    @property
    def measured(self) -> bool:
        """The rank measured steps: it has a breakdown to compare."""
        return self.breakdown is not None and self.measured_steps > 0

    @property
    def step_s(self) -> float:
        """Its mean measured step (0 without one)."""
        return self.breakdown.mean_step_s if self.breakdown is not None else 0.0
