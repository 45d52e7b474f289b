"""JSON form of a Report (schema: docs/report-format.md, pitstop/report/schema.json)."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from pitstop.findings import Report

SCHEMA_PATH = Path(__file__).with_name("schema.json")


def to_json(report: Report, indent: int | None = 2) -> str:
    return json.dumps(report.to_dict(), indent=indent, allow_nan=False)


def write_json(report: Report, path: str | os.PathLike[str]) -> Path:
    """Write atomically (temp file + rename) so a killed run never leaves half a report."""
    return atomic_write_text(Path(path), to_json(report) + "\n")


def load_json(path: str | os.PathLike[str]) -> Report:
    return Report.from_dict(json.loads(Path(path).read_text()))


def load_schema() -> dict[str, Any]:
    return json.loads(SCHEMA_PATH.read_text())


def atomic_write_text(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        # mkstemp creates 0600; a report should get the mode any new file gets (umask applied).
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
