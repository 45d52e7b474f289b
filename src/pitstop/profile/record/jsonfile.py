"""The child's records on disk: each JSON file replaced at once, so a reader (the parent, another rank)
never sees half of one."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """``data`` as JSON, replacing ``path`` at once."""
    from pitstop.findings import jsonable

    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(jsonable(data), allow_nan=False))
    os.replace(tmp, path)
