"""Per-step records and what they add up to: the step-time breakdown every report starts from."""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

# The parts of a step, in the order they are drawn. "other" is the rest of forward+backward time:
# Python between the calls, loss, logging (the step total minus every measured part).
PARTS = ("data_wait_s", "h2d_s", "forward_s", "backward_s", "optimizer_s", "sync_s", "other_s")
PART_LABELS = {
    "data_wait_s": "data wait",
    "h2d_s": "host-to-device copy",
    "forward_s": "forward",
    "backward_s": "backward",
    "optimizer_s": "optimizer",
    "sync_s": "host syncs",
    "other_s": "other",
}


@dataclass
class StepRecord:
    """One optimizer step, boundary to boundary, in seconds of wall time on the host."""

    index: int
    start_s: float
    total_s: float
    data_wait_s: float = 0.0
    h2d_s: float = 0.0
    sync_s: float = 0.0
    forward_s: float = 0.0
    backward_s: float = 0.0
    optimizer_s: float = 0.0
    syncs: float = 0  # on a step whose syncs were not sampled (``sync_sampled``), the sampled steps' mean
    minor_faults: int = 0  # pages mapped and zeroed during the step (getrusage ru_minflt)
    warmup: bool = False
    traced: bool = False
    eval: bool = False  # a no-grad (validation) forward ran inside this step
    h2d_gpu_s: float | None = None  # the copies' time on the GPU (CUDA events), when on CUDA
    sync_sampled: bool = True  # False: sync_s and syncs are estimates (pitstop.profile.capture.syncs)

    @property
    def compute_s(self) -> float:
        """Forward + backward + optimizer + everything else that is not data, copies or syncs."""
        return max(0.0, self.total_s - self.data_wait_s - self.h2d_s - self.sync_s)

    @property
    def other_s(self) -> float:
        # sync time can sit inside forward (e.g. a .item() in the model): don't count it twice
        rest = self.total_s - self.data_wait_s - self.h2d_s - self.forward_s - self.backward_s
        rest -= self.optimizer_s + self.sync_s
        return max(0.0, rest)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["compute_s"] = self.compute_s
        d["other_s"] = self.other_s
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> StepRecord:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


def usable_steps(steps: list[StepRecord]) -> list[StepRecord]:
    """Measured steps, leaving out the ones slowed by the profiler or holding a validation pass, when
    enough others remain."""
    plain = [s for s in steps if not s.traced and not s.eval]
    if len(plain) >= 3:
        return plain
    untraced = [s for s in steps if not s.traced]
    return untraced if len(untraced) >= 3 else steps


@dataclass
class Breakdown:
    """Mean seconds per step of each part (they add up to ``total_s``), over ``n`` steps."""

    n: int
    total_s: float
    median_total_s: float
    parts: dict[str, float]
    syncs_per_step: float
    faults_per_step: float = 0.0  # mean minor page faults: a step's cost is a mean, as its parts are

    def share(self, part: str) -> float:
        return self.parts.get(part, 0.0) / self.total_s if self.total_s > 0 else 0.0

    def labelled(self) -> dict[str, float]:
        return {PART_LABELS[k]: v for k, v in self.parts.items()}


def breakdown(steps: list[StepRecord]) -> Breakdown | None:
    steps = usable_steps(steps)
    if not steps:
        return None
    n = len(steps)
    parts = {p: sum(getattr(s, p) for s in steps) / n for p in PARTS}
    total = sum(parts.values())  # == mean total, since other_s is the remainder (clamped at 0)
    return Breakdown(
        n=n,
        total_s=total,
        median_total_s=statistics.median(s.total_s for s in steps),
        parts=parts,
        syncs_per_step=sum(s.syncs for s in steps) / n,
        faults_per_step=sum(s.minor_faults for s in steps) / n,
    )


def steps_per_s(steps: list[StepRecord]) -> float:
    """Throughput: the usable steps over their wall seconds, slow ones included (0.0 when none)."""
    steps = usable_steps(steps)
    total = sum(s.total_s for s in steps)
    return len(steps) / total if steps and total > 0 else 0.0


STEPS_LOG = "steps.jsonl"


class StepsLog:
    """A run's step records as JSON lines beside its measurements file, for the periodic flush: each
    record is written once, appended, so a flush costs the new records, not the whole run (rewriting
    every record each second grew with a long ``--full`` run). The flushed measurements name the log and
    how many of its lines count (``steps_log``, ``steps_count``); ``steps_from_log`` reads them back."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._last: Any = None  # the last record written
        self._n = 0
        self.generation = 0  # written afresh this many times: the log's first line, and the record's

    def write(self, records: list[dict[str, Any]]) -> int:
        """Append the records not written yet; a list whose first ones were dropped (micro-steps of an
        accumulation loop) is written afresh. Records must not change once written. Returns how many
        lines of the log are ``records``."""
        from pitstop.findings import jsonable

        fresh = (
            not self.generation
            or len(records) < self._n
            or (self._n and records[self._n - 1] is not self._last)
        )
        if fresh:
            self._n = 0
            self.generation += 1
        new = records[self._n :]
        if new or fresh:
            try:  # plain numbers, as the hooks record them: no need to walk them through jsonable
                lines = [json.dumps(r, allow_nan=False) for r in new]
            except (TypeError, ValueError):  # a NaN, a numpy scalar: as every other record is written
                lines = [json.dumps(jsonable(r), allow_nan=False) for r in new]
            if fresh:
                lines.insert(0, json.dumps({"generation": self.generation}))
            with open(self.path, "w" if fresh else "a") as f:
                f.write("".join(line + "\n" for line in lines))
        self._n = len(records)
        self._last = records[-1] if records else None
        return self._n


def steps_from_log(data: dict[str, Any], folder: Path) -> dict[str, Any]:
    """``data`` (a flushed measurements record) with its ``steps`` read from the log it names, up to the
    count it gives: lines after those (appended before a crash cut the flush short) do not count, nor does
    a log written afresh after the record (its first line, the generation, differs)."""
    name, count = data.get("steps_log"), int(data.get("steps_count") or 0)
    if "steps" in data or not isinstance(name, str):
        return data
    steps: list[dict[str, Any]] = []
    try:
        with open(folder / Path(name).name) as f:
            if json.loads(f.readline() or "{}").get("generation") != data.get("steps_generation"):
                return {**data, "steps": []}
            for line in f:
                if len(steps) >= count:
                    break
                steps.append(json.loads(line))
    except (OSError, ValueError):
        pass
    return {**data, "steps": steps}
