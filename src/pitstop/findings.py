"""The one record every part of pitstop reports in: a Finding, and a Report that holds them.

Data flows one way: probe or measure -> Findings -> report. Probes build these; renderers read them.
The JSON form is documented in docs/report-format.md and versioned by SCHEMA_VERSION.
"""

from __future__ import annotations

import datetime as _dt
import math
import platform
import socket
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

from pitstop.version import __version__

SCHEMA_VERSION = "1.0"


class Severity(StrEnum):
    """How much a finding matters. Ordered: PASS < INFO < WARN < ERROR."""

    PASS = "pass"
    INFO = "info"
    WARN = "warn"
    ERROR = "error"

    @property
    def rank(self) -> int:
        return _RANK[self]


_RANK = {Severity.PASS: 0, Severity.INFO: 1, Severity.WARN: 2, Severity.ERROR: 3}


@dataclass
class Finding:
    """One check or diagnosis.

    id:        stable dotted name (``dataloader.workers``); the part before the first dot is the area.
    evidence:  a sentence with the measured numbers and what they were measured on
               (``data wait 61% of 40 steps``).
    data:      the same numbers, machine-readable (JSON-compatible values only).
    fix:       what to do, in words; ``fix_code`` the code or command to write or run.
    location:  ``file:line`` in user code the finding concerns, when there is one.
    est_saving_s: measured time this problem costs per step (profile) or in total (others), in seconds.
    share:     that cost as a fraction of the step (0..1), when it is per step.
    """

    id: str
    severity: Severity
    title: str
    evidence: str = ""
    data: dict[str, Any] = field(default_factory=dict)
    fix: str = ""
    fix_code: str | None = None
    location: str | None = None
    est_saving_s: float | None = None
    share: float | None = None

    def __post_init__(self) -> None:
        self.severity = Severity(self.severity)

    @property
    def area(self) -> str:
        return self.id.split(".", 1)[0]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["severity"] = str(self.severity)
        d["area"] = self.area
        d["data"] = jsonable(self.data)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Finding:
        keys = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in d.items() if k in keys})


def rank_findings(findings: list[Finding]) -> list[Finding]:
    """Worst first: by severity, then by the cost that is sure (largest first, ``sure_saving``); then by
    the estimated cost (a sure part of 0 still ranks a larger estimate above a smaller one or none);
    then by id for stability."""
    return sorted(findings, key=lambda f: (-f.severity.rank, -sure_saving(f), -(f.est_saving_s or 0.0), f.id))


def dedupe(findings: list[Finding]) -> list[Finding]:
    """One finding per (id, location) where a location is given: the worst of them (severity, then
    cost) stays, in the first one's place; the others' differing data go under its ``data["merged"]``.
    Findings without a location are kept as they are."""
    keep: dict[tuple[str, str], int] = {}
    out: list[Finding] = []
    for f in findings:
        key = (f.id, f.location)
        if f.location is None:
            out.append(f)
            continue
        i = keep.get(key)
        if i is None:
            keep[key] = len(out)
            out.append(f)
            continue
        kept = out[i]
        if (f.severity.rank, f.est_saving_s or 0.0) > (kept.severity.rank, kept.est_saving_s or 0.0):
            f, kept = kept, f
        if f.data != kept.data and f.data not in kept.data.get("merged", []):
            kept.data = {**kept.data, "merged": [*kept.data.get("merged", []), f.data]}
        out[i] = kept
    return out


def by_area(findings: list[Finding]) -> list[tuple[str, list[Finding]]]:
    """The order every view shows findings in: grouped by area, the run's verdict (``summary``) first, then
    areas by their worst finding (``rank_findings``' key), each area's findings worst first."""
    areas: dict[str, list[Finding]] = {}
    for f in findings:
        areas.setdefault(f.area, []).append(f)
    ranked = {a: rank_findings(fs) for a, fs in areas.items()}
    order = sorted(
        ranked, key=lambda a: (a != "summary", -ranked[a][0].severity.rank, -sure_saving(ranked[a][0]), a)
    )
    return [(a, ranked[a]) for a in order]


def sure_saving(f: Finding) -> float:
    """The part of the finding's cost that is sure: the lower bound of its saving's interval
    (``data["saving_ci_s"]``) where it has one; 0 for a prediction judged without an interval
    (``saving_ci_s`` present but None: nothing of it was confirmed); else its measured cost (or 0)."""
    data = f.data if isinstance(f.data, dict) else {}
    if "saving_ci_s" not in data:
        return f.est_saving_s or 0.0
    ci = data["saving_ci_s"]
    if isinstance(ci, list | tuple) and ci and isinstance(ci[0], int | float):
        return max(0.0, float(ci[0]))
    return 0.0


@dataclass
class Report:
    """What one pitstop command measured: findings plus free-form measured sections (timelines, tables)."""

    tool: str
    findings: list[Finding] = field(default_factory=list)
    sections: dict[str, Any] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    created: str = field(default_factory=lambda: _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"))

    def add(self, *findings: Finding) -> None:
        self.findings.extend(findings)

    def worst(self) -> Severity:
        return max((f.severity for f in self.findings), key=lambda s: s.rank, default=Severity.PASS)

    def by_id(self, finding_id: str) -> Finding | None:
        return next((f for f in self.findings if f.id == finding_id), None)

    def ranked(self) -> list[Finding]:
        return rank_findings(self.findings)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "tool": self.tool,
            "pitstop_version": __version__,
            "created": self.created,
            "host": {"hostname": socket.gethostname(), "platform": platform.platform()},
            "meta": jsonable(self.meta),
            "error": self.error,
            "summary": _summary(self.findings),
            "findings": [f.to_dict() for f in self.ranked()],
            "sections": jsonable(self.sections),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Report:
        return cls(
            tool=d["tool"],
            findings=[Finding.from_dict(f) for f in d.get("findings", [])],
            sections=d.get("sections", {}),
            meta=d.get("meta", {}),
            error=d.get("error"),
            created=d.get("created", ""),
        )


def _summary(findings: list[Finding]) -> dict[str, int]:
    counts = {str(s): 0 for s in Severity}
    for f in findings:
        counts[str(f.severity)] += 1
    counts["total"] = len(findings)
    return counts


def jsonable(value: Any) -> Any:
    """Coerce measured values (numpy/torch scalars, tuples, paths, NaN) into strict JSON values."""
    if value is None or isinstance(value, bool | str | int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [jsonable(v) for v in value]
    if hasattr(value, "item") and callable(value.item):  # numpy / torch scalar
        try:
            return jsonable(value.item())
        except (TypeError, ValueError, RuntimeError):
            pass
    if hasattr(value, "to_dict"):
        return jsonable(value.to_dict())
    return str(value)
