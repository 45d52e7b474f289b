"""`pitstop fix --apply`: the code change of every fix that helped, as one unified diff per file.

Each kind's edit is the function its ``pitstop.recipes`` entry names in ``apply`` (a ``Site`` in,
edits on the file out), placed with ``ast`` at the locations the profile hooks recorded (the model's first forward
call, the optimizer's constructor, the DataLoader call), and everything else in the file is left byte for
byte:

- DataLoader keywords: each loader component's ``edit`` (``pitstop.recipes.dataloader``), the keywords
  written at the ``DataLoader(...)`` call in one edit (``pitstop.fix.patch``);
- a component's edit (``pitstop.recipes.component``; ``apply_component``), through the editor of its
  surface: ``ModelEditor`` for the model and the forward (channels_last: ``model = ...`` after the line
  that assigns the model, and ``x = ...`` for the forward's first input after the line that moves it with
  ``.to(...)``, before the forward's statement when no such line exists; autocast: the statements from
  the forward up to the ``.backward()`` call wrapped in ``with torch.autocast(...)``), ``OptimizerEditor``
  for the optimizer (foreach / fused: ``foreach=True`` / ``fused=True`` on its constructor call); compile
  and float32 through ``ModelEditor`` too (compile: ``model.compile()`` after the line that assigns the
  model, in place as the timed run compiled it; float32: ``model = ...``);
- keep_host_memory, and a process component's edit (tf32, cudnn.benchmark, threads: ``first_lines``):
  lines at the top of the script's ``main()`` (or of its ``if __name__ == "__main__":`` block, or after
  its imports), plus the import beside the others;
- the distributed fixes (static_graph, threads, no_sync): ``pitstop.fix.apply_dist``.

``pitstop.fix.apply_verify`` re-runs the patched script once and compares its speed with the interval
fix measured.
"""

from __future__ import annotations

import ast
import difflib
import importlib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pitstop.fix.core import FixResult, loader_of
from pitstop.fix.dist import worker_script
from pitstop.fix.patch import Patch, apply_patch, keyword_edit, loader_keywords, resolve
from pitstop.host.precision import device_type
from pitstop.profile.process.command import launcher_for
from pitstop.profile.runs.runner import CommandError, parse_command
from pitstop.recipes import by_name, component, components, host_memory
from pitstop.recipes.component import LOADER, OPTIMIZER, PROCESS

# (line before which to insert, 0-based, priority, lines) or a wrap: (start, priority, end, header)
Insert = tuple[int, int, list[str]]


@dataclass
class FileEdits:
    path: Path
    original: str
    text: str  # after the keyword edits (which keep every line where it was)
    inserts: list[Insert] = field(default_factory=list)
    wraps: list[tuple[int, int, str]] = field(default_factory=list)  # (first, last line 0-based, header)
    changes: dict[str, Any] = field(default_factory=dict)

    def tree(self) -> ast.Module:
        return ast.parse(self.text)

    def render(self) -> str:
        lines = self.text.splitlines(keepends=True)
        ops: list[tuple[int, int, Any]] = [(a, 0, ls) for a, _, ls in self.inserts]
        ops += [(a, 1, (b, h)) for a, b, h in self.wraps]
        for at, prio, what in sorted(ops, key=lambda o: (o[0], o[1]), reverse=True):
            if prio == 1:
                end, header = what
                body = ["    " + ln if ln.strip() else ln for ln in lines[at : end + 1]]
                lines[at : end + 1] = [header + "\n", *body]
            else:
                lines[at:at] = [ln + "\n" for ln in what]
        return "".join(lines)


def _indent(text: str, line: int) -> str:
    s = text.splitlines()[line - 1]
    return s[: len(s) - len(s.lstrip())]


def _statements(tree: ast.AST) -> list[tuple[ast.stmt, list[ast.stmt]]]:
    """Every statement with the body list it sits in."""
    out = []
    for node in ast.walk(tree):
        for name in ("body", "orelse", "finalbody", "handlers"):
            body = getattr(node, name, None)
            if isinstance(body, list):
                out += [(s, body) for s in body if isinstance(s, ast.stmt)]
    return out


def _innermost(tree: ast.AST, line: int) -> tuple[ast.stmt, list[ast.stmt]] | None:
    hits = [(s, b) for s, b in _statements(tree) if s.lineno <= line <= (s.end_lineno or s.lineno)]
    return min(hits, key=lambda sb: (sb[0].end_lineno or 0) - sb[0].lineno) if hits else None


def _forward_call(tree: ast.AST, line: int) -> ast.Call | None:
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and n.lineno <= line <= (n.end_lineno or 0)]
    calls = [c for c in calls if isinstance(c.func, ast.Name | ast.Attribute) and c.args]
    # the outermost call on the line whose callee is a plain name (model(x)) or attribute (self.model(x))
    named = [c for c in calls if not (isinstance(c.func, ast.Attribute) and c.func.attr in ("to", "cuda"))]
    return min(named, key=lambda c: len(ast.unparse(c.func)) - 1000 * (c.lineno == line), default=None)


def _targets(stmt: ast.stmt) -> list[str]:
    if isinstance(stmt, ast.Assign):
        tg: list[ast.expr] = list(stmt.targets)
    elif isinstance(stmt, ast.AnnAssign | ast.AugAssign):
        tg = [stmt.target]
    else:
        return []
    out = []
    for t in tg:
        out += [ast.unparse(e) for e in (t.elts if isinstance(t, ast.Tuple | ast.List) else [t])]
    return out


def _last_assignment(tree: ast.AST, name: str, before: int, moves: bool = False) -> ast.stmt | None:
    """The last statement assigning ``name`` before line ``before`` (with ``moves``: by a ``.to(...)``
    call). For the model only (not ``moves``), one anywhere in the file when none comes before: the
    forward often runs in a ``train()`` defined above the ``main()`` that builds the model."""
    found = [
        s for s, _ in _statements(tree) if name in _targets(s) and (not moves or ".to(" in ast.unparse(s))
    ]
    earlier = [s for s in found if s.lineno < before]
    return max(earlier or ([] if moves else found), key=lambda s: s.lineno, default=None)


class Unplaced(ValueError):
    """A fix whose code location could not be found in the file."""


def _after(fe: FileEdits, stmt: ast.stmt, line: str) -> None:
    fe.inserts.append((stmt.end_lineno or stmt.lineno, 0, [_indent(fe.text, stmt.lineno) + line]))


def _model_line(fe: FileEdits, where: int, line: Callable[[str], str], kind: str) -> str:
    tree = fe.tree()
    call = _forward_call(tree, where)
    if call is None:
        raise Unplaced(f"{kind}: no model call at line {where}")
    name = ast.unparse(call.func)
    assign = _last_assignment(tree, name, where)
    if assign is None:
        raise Unplaced(f"{kind}: no line assigning {name} in the file of line {where}")
    _after(fe, assign, line(name))
    return name


@dataclass
class ModelEditor:
    """A component's ``fix --apply`` edit (``pitstop.recipes.editing.ScriptEditor``; its ``first_lines``
    makes it a ``ProcessEditor`` too) on one file, at the model's forward call on line ``where``; ``kind``
    names the fix in ``Unplaced``'s message; ``setting``: the component's knob in the fix, ``device``: the
    run's device type."""

    fe: FileEdits
    where: int
    kind: str
    setting: Any = None
    device: str = "cpu"

    def reassign_model(self, value: Callable[[str], str]) -> str:
        return _model_line(self.fe, self.where, lambda name: f"{name} = {value(name)}", self.kind)

    def model_statement(self, line: Callable[[str], str]) -> str:
        return _model_line(self.fe, self.where, line, self.kind)

    def reassign_input(self, value: Callable[[str], str]) -> str:
        fe, where = self.fe, self.where
        tree = fe.tree()
        call = _forward_call(tree, where)
        arg = call.args[0] if call else None
        if not isinstance(arg, ast.Name):
            raise Unplaced(f"{self.kind}: the model's first input is not a plain variable")
        line = f"{arg.id} = {value(arg.id)}"
        moved = _last_assignment(tree, arg.id, where, moves=True)
        if moved is not None:
            _after(fe, moved, line)
        else:
            hit = _innermost(tree, where)
            assert hit is not None
            fe.inserts.append((hit[0].lineno - 1, 0, [_indent(fe.text, hit[0].lineno) + line]))
        return arg.id

    def reassign_indexed(self, value: Callable[[str], str]) -> str | None:
        fe, where = self.fe, self.where
        call = _forward_call(fe.tree(), where)
        arg = call.args[0] if call else None
        if not (isinstance(arg, ast.Subscript) and isinstance(arg.value, ast.Name)):
            return None
        name = arg.value.id
        made = _last_assignment(fe.tree(), name, where)
        if made is None or made.lineno >= where:
            raise Unplaced(f"{self.kind}: no line making {name} before the forward at line {where}")
        _after(fe, made, f"{name} = {value(name)}")
        return name

    def wrap_forward(self, header: str) -> None:
        fe = self.fe
        hit = _innermost(fe.tree(), self.where)
        if hit is None:
            raise Unplaced(f"{self.kind}: no statement at line {self.where}")
        stmt, body = hit
        i = body.index(stmt)
        k = next(
            (
                j
                for j in range(i, len(body))
                if any(
                    isinstance(n, ast.Call)
                    and isinstance(n.func, ast.Attribute)
                    and n.func.attr == "backward"
                    for n in ast.walk(body[j])
                )
            ),
            None,
        )
        last = body[k - 1] if k is not None and k > i else stmt
        fe.wraps.append(
            (
                stmt.lineno - 1,
                (last.end_lineno or last.lineno) - 1,
                f"{_indent(fe.text, stmt.lineno)}{header}",
            )
        )

    def first_lines(self, code: str) -> None:  # a process component's edit (where: unused)
        insert_first_line(self.fe, code)

    def need_torch(self) -> None:
        need_torch(self.fe)


@dataclass
class OptimizerEditor:
    """An optimizer component's ``fix --apply`` edit (``pitstop.recipes.editing.OptimizerEditor``) on
    the constructor call of every optimizer ``site``'s run recorded; ``fe``: the last file it edited."""

    site: Site
    setting: Any = None
    fe: FileEdits | None = None

    def keywords(self, values: Mapping[str, Any]) -> None:
        opts = self.site.config.get("optimizers") or []
        if not opts:
            raise Unplaced(f"{self.site.kind}: no optimizer was recorded")
        for o in opts:
            fe, line = self.site.file_at(o.get("location"), "optimizer")
            fe.text = keyword_edit(fe.text, line, dict(values), o.get("type"))
            self.fe = fe


def _main_top(fe: FileEdits) -> int:
    """0-based line before which a statement runs first in the script's main (or module)."""
    tree = fe.tree()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == "main":
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and len(node.body) > 1:
                first = node.body[1]  # after the docstring
            return first.lineno - 1
    for node in tree.body:
        if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test):
            return node.body[0].lineno - 1
    return _after_imports(tree)


def _after_imports(tree: ast.Module) -> int:
    imports = [n for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)]
    if imports:
        return imports[-1].end_lineno or imports[-1].lineno
    first = tree.body[0] if tree.body else None
    doc = isinstance(first, ast.Expr) and isinstance(getattr(first, "value", None), ast.Constant)
    return (first.end_lineno or 0) if doc and first else 0


def insert_first_line(fe: FileEdits, code: str, import_line: str | None = None) -> None:
    at = _main_top(fe)
    lines = fe.text.splitlines()
    indent = ""
    if at < len(lines):
        indent = lines[at][: len(lines[at]) - len(lines[at].lstrip())]
    fe.inserts.append((at, 1, [indent + line for line in code.splitlines()]))
    if import_line and import_line not in fe.text:
        fe.inserts.append((_after_imports(fe.tree()), 0, [import_line]))


def need_torch(fe: FileEdits) -> None:
    tree = fe.tree()
    has = any(
        isinstance(n, ast.Import) and any(a.name == "torch" and a.asname is None for a in n.names)
        for n in ast.walk(tree)
    )
    if not has and not any(ls == ["import torch"] for _, _, ls in fe.inserts):
        fe.inserts.append((_after_imports(tree), 0, ["import torch"]))


# ----------------------------------------------------------------------------------------------- plan


def _loader_kind(kind: str) -> bool:
    """A fix written as DataLoader keywords (a ``LOADER`` component: merged into one edit of the call)."""
    comp = component(kind)
    return comp is not None and comp.SURFACE == LOADER


@dataclass
class Plan:
    patches: list[Patch] = field(default_factory=list)
    unplaced: list[str] = field(default_factory=list)  # fixes whose code location was not found, and why


def plan(result: FixResult, cwd: str | os.PathLike[str] | None = None) -> Plan:
    """The patches for the fixes ``result`` recommends (one per file), and the ones that could not be
    placed. Nothing is written."""
    out = Plan()
    chosen = [m for m in result.candidates if m.name in result.chosen]
    files: dict[Path, FileEdits] = {}

    def file_at(location: str | None, what: str) -> tuple[FileEdits, int]:
        if not location:
            raise Unplaced(f"{what}: the profile recorded no location for it")
        path, line = resolve(location, cwd)
        if path not in files:
            try:
                text = path.read_text(encoding="utf-8")
                ast.parse(text)
            except (OSError, SyntaxError) as e:
                raise Unplaced(f"{what}: cannot read {path}: {e}") from e
            files[path] = FileEdits(path, text, text)
        return files[path], line

    config = result.config
    models = config.get("models") or []
    model_at = models[0].get("first_location") if models else None
    loader_changes: dict[str, Any] = {}
    for m in chosen:
        loader_changes.update(m.overrides.get("dataloader") or {})
    edits: list[tuple[str, Callable[[], None]]] = []
    if loader_changes:

        def loader() -> None:
            fe, line = file_at(loader_of(config).get("location"), "DataLoader")
            written = loader_keywords(loader_changes)
            fe.text = keyword_edit(fe.text, line, written, "DataLoader")
            fe.changes["dataloader"] = written

        edits.append(("dataloader", loader))
    for m in chosen:
        # an optimizer component's knob set beside another fix: its edit too
        kinds = {m.kind} | {c.NAME for c in components(OPTIMIZER) if m.overrides.get(c.KNOB)}
        for kind in kinds:
            site = Site(kind, m.overrides, config, model_at, file_at, result, cwd)
            edits.append((kind, _kind_edit(site)))
    done: set[str] = set()
    for kind, edit in edits:
        if kind in done or kind == "combined" or _loader_kind(kind):
            continue
        done.add(kind)
        try:
            edit()
        except (Unplaced, ValueError) as e:
            out.unplaced.append(str(e))
    for fe in files.values():
        patched = fe.render()
        if patched == fe.original:
            continue
        ast.parse(patched)  # an edit that breaks the file is a bug here, never written
        name = os.path.relpath(fe.path) if not os.path.relpath(fe.path).startswith("..") else str(fe.path)
        diff = "".join(
            difflib.unified_diff(
                fe.original.splitlines(keepends=True),
                patched.splitlines(keepends=True),
                fromfile=f"a/{name}",
                tofile=f"b/{name}",
            )
        )
        first = next(
            (
                i + 1
                for i, (a, b) in enumerate(zip(fe.original.splitlines(), patched.splitlines(), strict=False))
                if a != b
            ),
            1,
        )
        out.patches.append(Patch(fe.path, first, fe.original, patched, diff, dict(fe.changes)))
    return out


@dataclass
class Site:
    """What one fix's edit needs: its overrides, the baseline run's config and where its code goes."""

    kind: str
    overrides: dict[str, Any]
    config: dict[str, Any]
    model_at: str | None
    file_at: Callable[[str | None, str], tuple[FileEdits, int]]
    result: FixResult
    cwd: str | os.PathLike[str] | None


def apply_component(site: Site) -> None:
    """The edit of the kind's component (``pitstop.recipes.component``) through the editor of its
    surface: ``OptimizerEditor`` at the recorded optimizers' constructors, ``ModelEditor`` at the model's
    first forward (for a ``PROCESS`` one: ``first_lines`` at the top of the script's main; messages name
    the component's knob); the file records what it changed."""
    comp = component(site.kind)
    if comp is None:
        raise Unplaced(f"{site.kind}: no component holds its edit")
    setting = site.overrides.get(comp.KNOB)
    if comp.SURFACE == OPTIMIZER:
        editor = OptimizerEditor(site, setting)
        changes = comp.edit(editor)
        fe = editor.fe
    elif comp.SURFACE == PROCESS:
        fe = script_file(site)
        changes = comp.edit(ModelEditor(fe, 0, comp.KNOB, setting, device_type(site.config.get("device"))))
    else:
        fe, line = site.file_at(site.model_at, comp.KNOB)
        changes = comp.edit(ModelEditor(fe, line, comp.KNOB, setting, device_type(site.config.get("device"))))
    if fe is not None:
        fe.changes.update(changes)


def script_file(site: Site) -> FileEdits:
    try:
        what, script, args = parse_command(site.result.command, str(site.cwd) if site.cwd else None)
    except CommandError as e:
        raise Unplaced(f"{site.kind}: {e}") from e
    launcher = launcher_for(what, script, args)
    if not launcher and what != "script":
        raise Unplaced(f"{site.kind}: the command runs a module, not a script file")
    if launcher:  # the workers' script, never the launcher's own console script
        try:
            script = worker_script(launcher, args)
        except ImportError as e:
            raise Unplaced(f"{site.kind}: cannot read the {launcher} command: {e}") from e
        if script is None:
            raise Unplaced(f"{site.kind}: the {launcher} command runs a module, not a script file")
    return site.file_at(f"{script}:1", site.kind)[0]


def apply_keep_host_memory(site: Site) -> None:
    fe = script_file(site)
    insert_first_line(fe, host_memory.EDIT_LINE, host_memory.EDIT_IMPORT)
    fe.changes["keep_host_memory"] = True


def _kind_edit(site: Site) -> Callable[[], None]:
    """The edit the kind's recipe names in its ``apply`` field."""

    def edit() -> None:
        r = by_name(site.kind)
        dotted = r.apply if r else None
        if not dotted:
            raise Unplaced(f"{site.kind}: no code change is known for it")
        module, _, name = dotted.rpartition(".")
        getattr(importlib.import_module(module), name)(site)

    return edit


def apply_all(patches: list[Patch]) -> list[Path]:
    """Write every patch (each file keeps a backup); refuses before writing any when a file changed."""
    for p in patches:
        if p.path.read_text(encoding="utf-8") != p.original:
            raise ValueError(f"{p.path} changed since pitstop read it; re-run pitstop fix")
    return [apply_patch(p) for p in patches]
