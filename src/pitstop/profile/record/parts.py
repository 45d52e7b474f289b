"""The nested parts of the measurements record the rules read, typed (``record.measurements``): the run's
totals, each optimizer, the memory peaks, the exit probes' results, the watchdog's record, the CUDA
events' device time and the ``--trace`` window. Each is a ``record.base.Record``: JSON in and out by its
fields' names, a key it does not name kept in ``extra``, a key written as null written as null again."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from pitstop.profile.record.base import Record

NO_NAMES: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Totals(Record):
    """What ran over the whole run, steps or not (``capture.hooks.Instrumentation.totals``)."""

    data_wait_s: float | None = None
    forward_s: float | None = None
    backward_s: float | None = None
    optimizer_s: float | None = None
    batches: int | None = None
    forwards: int | None = None
    train_forwards: int | None = None
    backwards: int | None = None
    optimizer_steps: int | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    nulls: frozenset[str] = field(default=NO_NAMES, compare=False, repr=False)


@dataclass(frozen=True)
class OptimizerRecord(Record):
    """One optimizer as the script built it (``capture.torchcalls``) and the implementation its step ran
    (``capture.facts.finish_optimizer_facts``)."""

    type: str | None = None
    location: str | None = None
    foreach: bool | None = None
    fused: bool | None = None
    supports_foreach: bool | None = None
    supports_fused: bool | None = None
    override: Any = None
    impl: str | None = None
    params: int | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    nulls: frozenset[str] = field(default=NO_NAMES, compare=False, repr=False)


@dataclass(frozen=True)
class MemoryRecord(Record):
    """The process's memory peaks (``capture.gpu_memory.memory_facts`` on CUDA) and the CUDA OOM seen."""

    peak_rss_bytes: int | None = None
    cuda_peak_allocated_bytes: int | None = None
    cuda_peak_reserved_bytes: int | None = None
    cuda_allocated_bytes: int | None = None
    cuda_reserved_bytes: int | None = None
    cuda_fragmentation_bytes: int | None = None
    cuda_peak_fragmentation_bytes: int | None = None
    cuda_memory_error: str | None = None
    oom: dict[str, Any] | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    nulls: frozenset[str] = field(default=NO_NAMES, compare=False, repr=False)

    def cuda(self) -> dict[str, Any]:
        """The CUDA allocator's numbers, by JSON key."""
        return {k: v for k, v in self.to_json().items() if k.startswith("cuda_")}


@dataclass(frozen=True)
class ProbeResult(Record):
    """One exit probe's result (``probe.probe_kit.saving`` and the probes' own keys): the medians of the
    base and the changed pass, the saving and its interval, or why it was skipped or failed."""

    base_s: float | None = None
    new_s: float | None = None
    saving_s: float | None = None
    saving_lo_s: float | None = None
    saving_hi_s: float | None = None
    budget_s: float | None = None
    budget_scaled: bool | None = None
    rounds: int | None = None
    interval: dict[str, Any] | None = None
    interval_text: str | None = None
    type: str | None = None
    location: str | None = None
    dtype: str | None = None
    skipped: Any = None  # why it did not run (text; the precision probe: its slow matmuls)
    slower: bool | None = None
    error: str | None = None
    confirmed: bool | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    nulls: frozenset[str] = field(default=NO_NAMES, compare=False, repr=False)

    @property
    def timed(self) -> bool:
        """Both passes were timed: the result has a saving to judge."""
        return self.saving_s is not None and self.base_s is not None


@dataclass(frozen=True)
class Probes(Record):
    """The exit probes' results (``probe.probes.run_probes``, ``process.instrumented.finalize``): each
    probe's ``ProbeResult`` by its key (``results``; a recipe's ``probe``), the optimizer probes, and the
    model probes' device, error and what was skipped."""

    NESTED: ClassVar[dict[str, type[Record]]] = {"optimizer": ProbeResult}
    OWN: ClassVar[frozenset[str]] = Record.OWN | {"results"}

    device_type: str | None = None
    error: str | None = None
    skipped: list[str] | None = None
    optimizer: tuple[ProbeResult, ...] = ()
    results: Mapping[str, ProbeResult] = field(default_factory=dict)
    extra: Mapping[str, Any] = field(default_factory=dict)
    absent: frozenset[str] = field(default=NO_NAMES, compare=False, repr=False)
    nulls: frozenset[str] = field(default=NO_NAMES, compare=False, repr=False)

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None) -> Probes:
        d = d or {}
        named = {"device_type", "error", "skipped", "optimizer"}
        results = {k: v for k, v in d.items() if k not in named and isinstance(v, Mapping)}
        rec = super().from_json({k: v for k, v in d.items() if k not in results})
        return replace(rec, results={k: ProbeResult.from_json(v) for k, v in results.items()})

    def to_json(self) -> dict[str, Any]:
        return {**super().to_json(), **{k: r.to_json() for k, r in self.results.items()}}

    def result(self, key: str | None) -> ProbeResult | None:
        """The result of the probe stored under ``key`` (None where it did not run)."""
        return self.results.get(key or "")


@dataclass(frozen=True)
class WatchdogRecord(Record):
    """What the watchdog saw (``capture.watchdog``, noted by the parent): the stacks of a hang, the
    stop at ``--timeout``, the stalled steps' samples and CPU contention windows."""

    run_status: str | None = None
    hang: dict[str, Any] | None = None  # the hang's stacks (``capture.watchdog.hang_verdict``)
    stop: dict[str, Any] | None = None  # the stacks at --timeout or Ctrl-C
    end: dict[str, Any] | None = None  # the loaders' workers at the script's end
    error: Any = None  # the loaders' workers when the script raised; the watchdog's own error as text
    unanswered: bool | None = None
    samples: list[dict[str, Any]] | None = None
    contention: list[dict[str, Any]] | None = None
    poll_s: float | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    nulls: frozenset[str] = field(default=NO_NAMES, compare=False, repr=False)


@dataclass(frozen=True)
class DeviceTime(Record):
    """The CUDA events' device time per read step (``capture.device_time.DeviceTimer.summary``)."""

    steps: list[dict[str, Any]] | None = None
    error: str | None = None
    anchored: bool | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    nulls: frozenset[str] = field(default=NO_NAMES, compare=False, repr=False)


@dataclass(frozen=True)
class TraceRecord(Record):
    """The ``--trace`` window (``capture.trace.StepTracer.summary``) and its kernel analysis."""

    path: str | None = None
    steps: int | None = None
    top_ops: list[Any] | None = None
    error: str | None = None
    analysis: dict[str, Any] | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    nulls: frozenset[str] = field(default=NO_NAMES, compare=False, repr=False)
