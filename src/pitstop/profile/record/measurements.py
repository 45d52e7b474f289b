"""The child's measurements record, typed: what the script's process writes (``measurements.json``) as
frozen dataclasses the parent reads it into, so the rules read ``m.loaders[0].num_workers`` rather than
``data.get("loaders")[0].get("num_workers")``.

Each record's ``from_json`` takes the JSON mapping as written: a missing key is the field's default, a
key the record does not name is kept in its ``extra`` mapping, so ``to_json`` gives back the same keys
(fields left at None are left out, except where a nested record's JSON held them as null) and nothing a newer child adds is lost on the way through. The
record carries its ``SCHEMA`` (``"schema"``, stamped by the child where it writes the record); one
without it is from an older pitstop and read as schema 1; one from a newer major schema is refused
(``NewerRecord``), as this pitstop cannot know what its fields mean.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pitstop.profile.record.base import Record
from pitstop.profile.record.parts import (
    DeviceTime,
    MemoryRecord,
    OptimizerRecord,
    Probes,
    Totals,
    TraceRecord,
    WatchdogRecord,
)

__all__ = [
    "SCHEMA",
    "DeviceTime",
    "LoaderRecord",
    "Measurements",
    "MemoryRecord",
    "ModelRecord",
    "NewerRecord",
    "OptimizerRecord",
    "Probes",
    "Record",
    "SyncSite",
    "Totals",
    "TraceRecord",
    "WatchdogRecord",
]

SCHEMA = 1  # the record's major version: a change that old readers would misread raises it


class NewerRecord(ValueError):
    """A measurements record from a newer pitstop, whose schema this one does not read."""


def check_schema(d: Mapping[str, Any]) -> None:
    """Raise ``NewerRecord`` where ``d`` names a major schema above ``SCHEMA`` (none: an older record)."""
    schema = d.get("schema")
    if isinstance(schema, int) and schema > SCHEMA:
        raise NewerRecord(
            f"the measurements record has schema {schema}, newer than this pitstop reads ({SCHEMA}): "
            "it was written by a newer pitstop; profile with the same version, or upgrade this one"
        )


@dataclass(frozen=True)
class LoaderRecord(Record):
    """One DataLoader as the run used it (``record.captured.CapturedLoader.settings``)."""

    location: str | None = None
    num_workers: int | None = None
    pin_memory: bool | None = None
    persistent_workers: bool | None = None
    batch_size: int | None = None
    batches_per_epoch: int | None = None
    iterators: int | None = None
    batches_seen: int | None = None
    wait_s: float | None = None
    first_batch_s: list[float] | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    nulls: frozenset[str] = field(default=frozenset(), compare=False, repr=False)

    @property
    def workers(self) -> int:
        return self.num_workers or 0


@dataclass(frozen=True)
class SyncSite(Record):
    """One place in the script that synchronized host and device (``capture.syncs``)."""

    location: str | None = None
    method: str | None = None
    count: int | None = None
    measured_count: int | None = None
    time_s: float | None = None
    loop_gap_s: float | None = None
    sampled_steps: int | None = None
    measured_steps: int | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    nulls: frozenset[str] = field(default=frozenset(), compare=False, repr=False)


@dataclass(frozen=True)
class ModelRecord(Record):
    """One model's facts (``capture.facts.model_facts`` and what the hooks add); the recipes' components
    read the rest by key (``to_json()``)."""

    type: str | None = None
    device: str | None = None
    first_location: str | None = None
    dataparallel: bool | None = None
    param_dtypes: Mapping[str, Any] | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    nulls: frozenset[str] = field(default=frozenset(), compare=False, repr=False)


@dataclass(frozen=True)
class Measurements(Record):
    """One process's measurements record (``capture.hooks.Instrumentation.snapshot``, the probes'
    results ``process.instrumented.finalize`` adds, and what the parent notes: ``other_cpu_share``,
    ``steal_share``, ``watchdog``, ``workers_two_process``)."""

    NESTED: ClassVar[dict[str, type[Record]]] = {
        "loaders": LoaderRecord,
        "sync_sites": SyncSite,
        "models": ModelRecord,
        "optimizers": OptimizerRecord,
    }
    ONE: ClassVar[dict[str, type[Record]]] = {
        "totals": Totals,
        "memory": MemoryRecord,
        "device_time": DeviceTime,
        "trace": TraceRecord,
        "probes": Probes,
        "watchdog": WatchdogRecord,
    }
    KEEP_NULLS: ClassVar[bool] = False  # the parent's copy leaves a null out; the child's (``build``) writes it

    schema: int | None = None
    version: int | None = None
    status: str | None = None
    error: str | None = None
    traceback: str | None = None
    device: str | None = None
    warmup: int | None = None
    step_boundary: str | None = None
    steps: list[dict[str, Any]] | None = None
    totals: Totals | None = None
    loaders: tuple[LoaderRecord, ...] = ()
    sync_sites: tuple[SyncSite, ...] = ()
    models: tuple[ModelRecord, ...] = ()
    optimizers: tuple[OptimizerRecord, ...] = ()
    torch: dict[str, Any] | None = None
    memory: MemoryRecord | None = None
    gpu_util: dict[str, Any] | None = None
    device_time: DeviceTime | None = None
    trace: TraceRecord | None = None
    mfu: dict[str, Any] | None = None
    probes: Probes | None = None
    watchdog: WatchdogRecord | None = None
    distributed: dict[str, Any] | None = None
    other_cpu_share: float | None = None
    steal_share: float | None = None
    workers_two_process: dict[str, Any] | None = None
    flush_error: str | None = None  # the last periodic record write that failed (``hooks._periodic_flush``)
    extra: Mapping[str, Any] = field(default_factory=dict)
    absent: frozenset[str] = field(default=frozenset(), compare=False, repr=False)
    nulls: frozenset[str] = field(default=frozenset(), compare=False, repr=False)

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None) -> Measurements:
        check_schema(d or {})
        return super().from_json(d)

    @property
    def model(self) -> ModelRecord:
        """The first model (the one the probes time), or an empty record where none was seen."""
        return self.models[0] if self.models else ModelRecord()

    @property
    def probe_results(self) -> dict[str, Any]:
        """The probes' results as JSON, for the recipes' components that read them by key."""
        return self.probes.to_json() if self.probes is not None else {}

    @property
    def probed(self) -> Probes:
        """The probes' results, typed (empty where no probe ran)."""
        return self.probes if self.probes is not None else Probes()

    @property
    def run_totals(self) -> Totals:
        """What ran over the whole run (empty where the record has none)."""
        return self.totals if self.totals is not None else Totals()

    @property
    def used_loaders(self) -> tuple[LoaderRecord, ...]:
        """The loaders that gave at least one batch."""
        return tuple(ld for ld in self.loaders if ld.batches_seen)

    @property
    def dev_type(self) -> str:
        """The kind of device the run trained on (``cuda``, ``cpu``, ...): the run's, else its model's."""
        return (self.device or self.model.device or "cpu").split(":")[0]
