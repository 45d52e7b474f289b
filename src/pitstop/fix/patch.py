"""A unified diff that changes the keyword arguments of one call (a DataLoader(...), an optimizer's
constructor) in the user's file.

The call is found with ``ast`` at the file:line the profile hooks recorded; existing keywords have their
value replaced, missing ones are added after the last argument, and everything else in the file is
left byte for byte. ``apply_patch`` writes it only if the file is unchanged since, keeping a backup.
"""

from __future__ import annotations

import ast
import difflib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pitstop.recipes import loader_components
from pitstop.report.jsonfmt import atomic_write_text


@dataclass
class Patch:
    path: Path
    line: int
    original: str
    patched: str
    diff: str
    changes: dict[str, Any]


def _offsets(text: str) -> list[int]:
    """Character offset of the start of each line (1-based line numbers index it directly)."""
    starts = [0, 0]
    for line in text.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    return starts


def _pos(text: str, starts: list[int], lineno: int, col_bytes: int) -> int:
    """ast gives UTF-8 byte columns; turn (line, byte column) into a character offset."""
    line_start = starts[lineno]
    line = text[line_start : starts[lineno + 1] if lineno + 1 < len(starts) else len(text)]
    return line_start + len(line.encode("utf-8")[:col_bytes].decode("utf-8", errors="ignore"))


def _is_call_to(call: ast.Call, name: str | None) -> bool:
    f = call.func
    if name is None:
        return True
    return (isinstance(f, ast.Name) and f.id == name) or (isinstance(f, ast.Attribute) and f.attr == name)


def find_call(tree: ast.AST, line: int, name: str | None = "DataLoader") -> ast.Call | None:
    """The ``name(...)`` call at ``line`` (starting there, or spanning it); any call when name is None."""
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and _is_call_to(n, name)]
    starting = [c for c in calls if c.lineno == line]
    if starting:
        return starting[0]
    spanning = [c for c in calls if c.lineno <= line <= (c.end_lineno or c.lineno)]
    return min(spanning, key=lambda c: (c.end_lineno or c.lineno) - c.lineno) if spanning else None


def resolve(location: str, cwd: str | os.PathLike[str] | None = None) -> tuple[Path, int]:
    path, _, line = location.rpartition(":")
    if not path or not line.isdigit():
        raise ValueError(f"not a file:line location: {location!r}")
    p = Path(path)
    if not p.is_absolute():
        p = Path(cwd or os.getcwd()) / p
    return p, int(line)


def keyword_edit(text: str, line: int, changes: dict[str, Any], name: str | None = "DataLoader") -> str:
    """``text`` with ``changes`` (keyword -> Python value) set on the ``name(...)`` call at ``line``.
    Raises SyntaxError when the text does not parse, ValueError when there is no such call."""
    tree = ast.parse(text)
    call = find_call(tree, line, name)
    if call is None:
        raise ValueError(f"no {name or 'call'}(...) call")
    starts = _offsets(text)
    edits: list[tuple[int, int, str]] = []  # (start, end, replacement) as character offsets
    existing = {kw.arg: kw for kw in call.keywords if kw.arg}
    missing = []
    for key, value in changes.items():
        kw = existing.get(key)
        if kw is not None:
            v = kw.value
            a = _pos(text, starts, v.lineno, v.col_offset)
            b = _pos(text, starts, v.end_lineno or v.lineno, v.end_col_offset or v.col_offset)
            edits.append((a, b, repr(value)))
        else:
            missing.append(f"{key}={value!r}")
    if missing:
        args: list[ast.AST] = [*call.args, *call.keywords]
        if args:
            last = max(args, key=lambda n: (n.end_lineno or 0, n.end_col_offset or 0))
            at = _pos(text, starts, last.end_lineno or last.lineno, last.end_col_offset or 0)
            edits.append((at, at, ", " + ", ".join(missing)))
        else:  # DataLoader() with no arguments: insert inside the parentheses
            at = _pos(text, starts, call.end_lineno or call.lineno, (call.end_col_offset or 1) - 1)
            edits.append((at, at, ", ".join(missing)))
    patched = text
    for a, b, rep in sorted(edits, reverse=True):
        patched = patched[:a] + rep + patched[b:]
    return patched


@dataclass
class LoaderKeywords:
    """A ``editing.LoaderEditor``: the keywords the loader components write, gathered for one edit of
    the ``DataLoader(...)`` call."""

    setting: Any = None
    values: dict[str, Any] = field(default_factory=dict)

    def keywords(self, values: Mapping[str, Any]) -> None:
        self.values.update(values)


def loader_keywords(forced: Mapping[str, Any]) -> dict[str, Any]:
    """The keywords the chosen fixes force, each written by its loader component's ``edit`` (in the
    order forced; a keyword no component holds, the tuner's, as it is)."""
    by_key = {c.KEY: c for c in loader_components()}
    editor = LoaderKeywords()
    for key, value in forced.items():
        if key in by_key:
            editor.setting = value
            by_key[key].edit(editor)
        else:
            editor.keywords({key: value})
    return editor.values


def dataloader_patch(
    location: str, changes: dict[str, Any], cwd: str | os.PathLike[str] | None = None
) -> Patch:
    """Build the patch that sets ``changes`` (keyword -> Python value) on the DataLoader call at
    ``location``. Raises ValueError when the file or the call cannot be found."""
    path, line = resolve(location, cwd)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ValueError(f"cannot read {path}: {e}") from e
    try:
        patched = keyword_edit(text, line, loader_keywords(changes))
    except SyntaxError as e:
        raise ValueError(f"cannot parse {path}: {e}") from e
    except ValueError as e:
        raise ValueError(f"{e} at {location}") from e
    name = os.path.relpath(path) if not os.path.relpath(path).startswith("..") else str(path)
    diff = "".join(
        difflib.unified_diff(
            text.splitlines(keepends=True),
            patched.splitlines(keepends=True),
            fromfile=f"a/{name}",
            tofile=f"b/{name}",
        )
    )
    return Patch(path=path, line=line, original=text, patched=patched, diff=diff, changes=dict(changes))


def backup_path(path: Path) -> Path:
    candidate = path.with_name(path.name + ".pitstop.bak")
    n = 1
    while candidate.exists():
        candidate = path.with_name(f"{path.name}.pitstop.bak{n}")
        n += 1
    return candidate


def apply_patch(patch: Patch) -> Path:
    """Write the patched file (atomically) after saving the original next to it; returns the backup path.
    Refuses when the file changed since the patch was made."""
    current = patch.path.read_text(encoding="utf-8")
    if current != patch.original:
        raise ValueError(f"{patch.path} changed since pitstop read it; re-run pitstop fix")
    mode = patch.path.stat().st_mode
    backup = backup_path(patch.path)
    backup.write_text(current, encoding="utf-8")
    atomic_write_text(patch.path, patch.patched)
    os.chmod(patch.path, mode & 0o7777)  # the temp file was created 0600
    return backup
