"""One candidate fix of ``pitstop fix``: the overrides a child run injects, and why it is tried. Built by
``core`` (from the recipes) and ``dist`` (for launcher commands)."""

from __future__ import annotations

from dataclasses import dataclass

from pitstop.profile.record.overrides import Overrides


@dataclass
class Candidate:
    name: str
    kind: str
    overrides: Overrides
    why: str  # the finding that suggested it, or "requested"
    cannot_help: str | None = None  # the script's own facts say it has nothing to act on (still measured)
