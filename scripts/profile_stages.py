"""Rewrite references to profile's modules from their flat paths to their stage packages (issue 33).

    python scripts/profile_stages.py [--all] [FILE_OR_DIR ...]  # default: src tests benchmarks examples docs ...

``pitstop.profile.hooks`` became ``pitstop.profile.capture.hooks``, ``profile/hooks.py`` became
``profile/capture/hooks.py``, and ``from pitstop.profile import summary, RunSpec`` is split into one import
per package. Idempotent: a rewritten path no longer matches, so it also serves a branch that was edited
against the flat layout (run it on the merged tree). In ``IMPORTS_ONLY`` files only import lines change,
so edits made to those files elsewhere merge across the renames; ``--all`` rewrites their docstrings and
comments too, once those edits are merged.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

STAGES = {
    "record": "timeline overrides captured",
    "capture": "hooks patches stepclock watchdog syncs loaders models torchcalls points device_time "
    "gpu_memory direct_forward facts trace trace_analysis stacks where",
    "probe": "probes probe_kit probe_float64 gpu_probes thread_probe mfu",
    "rank": "rank_worker rank_share rank_stop rank_states comm comm_hook ddp_timers",
    "process": "bootstrap instrumented children child_worker rank_start command rankhook",
    "analyze": "rules rulekit rules_compute rules_progress pass_rules gpu_rules dist_rules contention_rules "
    "probe_failures summary headline stalls confirm wait_confirm",
    "runs": "runner supervise result children_report ranks merge",
    "present": "render render_ranks render_stacks render_views gpu_render export tensorboard wandb_sink "
    "mlflow_sink",
    "confirm": "fresh_confirm fresh_runs budget fix_verdicts malloc_confirm workers_confirm",
}
STAGE_OF = {mod: stage for stage, mods in STAGES.items() for mod in mods.split()}
# modules other branches edit in place: only their import lines are rewritten
IMPORTS_ONLY = {"syncs", "hooks", "children", "child_worker", "watchdog"}
DEFAULT = ["src", "tests", "benchmarks", "examples", "docs", "README.md", "scripts/demo.sh"]
SUFFIXES = {".py", ".md", ".sh", ".toml", ".cfg", ".ini", ".txt"}
SKIP_DIRS = {"results", "__pycache__"}  # records of measured runs keep the paths they had
SKIP_FILES = {"RESULTS.md", "CHANGELOG.md"}

_NAMES = "|".join(sorted(STAGE_OF, key=len, reverse=True))
# not where the name is already a stage package, followed by one of its modules or importing them (the
# package confirm/ and the module analyze/confirm.py share a name)
DOTTED = re.compile(rf"\bpitstop\.profile\.({_NAMES})\b(?!\.py\b)(?!\.(?:{_NAMES})\b)")
PKG_IMPORT = re.compile(r" import \(?\s*(\w+)")
SLASHED = re.compile(rf"\b(pitstop/profile/({_NAMES})\b|profile/({_NAMES})\.py\b)")
FROM_PKG = re.compile(r"^([ \t]*)from pitstop\.profile import (\(([^)]*)\)|[^\n]*)", re.M)
IMPORT_LINE = re.compile(r"^[ \t]*(from|import)[ \t]", re.M)


def _split_from(match: re.Match[str]) -> str:
    """``from pitstop.profile import a, b as c`` -> one import per package the names now live in."""
    indent, body = match.group(1), match.group(3) if match.group(3) is not None else match.group(2)
    comment = ""
    if match.group(3) is None and "#" in body:
        body, comment = body.split("#", 1)
        comment = "  #" + comment
    names = [n.strip() for n in re.sub(r"#[^\n]*", "", body).replace("\n", " ").split(",") if n.strip()]
    by_pkg: dict[str, list[str]] = {}
    for name in names:
        stage = STAGE_OF.get(name.split()[0])
        by_pkg.setdefault(f"pitstop.profile.{stage}" if stage else "pitstop.profile", []).append(name)
    if list(by_pkg) == ["pitstop.profile"]:
        return match.group(0)
    lines = [f"{indent}from {pkg} import {', '.join(sorted(ns))}" for pkg, ns in sorted(by_pkg.items())]
    lines[0] += comment
    return "\n".join(lines)


def _dotted(match: re.Match[str]) -> str:
    name = match.group(1)
    imported = PKG_IMPORT.match(match.string, match.end())
    if name in STAGES and imported and STAGE_OF.get(imported.group(1)) == name:
        return match.group(0)  # ``from pitstop.profile.confirm import budget``: the package already
    return f"pitstop.profile.{STAGE_OF[name]}.{name}"


def rewrite(text: str, imports_only: bool) -> str:
    text = FROM_PKG.sub(_split_from, text)
    if imports_only:
        out = []
        for line in text.splitlines(keepends=True):
            out.append(DOTTED.sub(_dotted, line) if IMPORT_LINE.match(line) else line)
        return "".join(out)
    text = DOTTED.sub(_dotted, text)
    return SLASHED.sub(_slashed, text)


def _slashed(match: re.Match[str]) -> str:
    """``pitstop/profile/X`` or ``profile/X.py`` -> the same path in X's stage package."""
    name = match.group(2) or match.group(3)
    return match.group(1).replace(f"profile/{name}", f"profile/{STAGE_OF[name]}/{name}", 1)


def files(roots: list[str]) -> list[Path]:
    found: list[Path] = []
    for root in map(Path, roots):
        if root.is_file():
            found.append(root)
        elif root.is_dir():
            found += [
                p
                for p in sorted(root.rglob("*"))
                if p.is_file() and p.suffix in SUFFIXES and not SKIP_DIRS & set(p.parts) and p.name not in SKIP_FILES
            ]
    return found


def _imports_only(path: Path) -> bool:
    parts = path.resolve().parts
    if "pitstop" in parts and {"bench", "train"} & set(parts[parts.index("pitstop") :]):
        return True
    return path.stem in IMPORTS_ONLY and "profile" in parts


def main(argv: list[str]) -> int:
    everything = "--all" in argv
    argv = [a for a in argv if a != "--all"]
    changed = 0
    for path in files(argv or DEFAULT):
        if path.resolve() == Path(__file__).resolve():
            continue
        text = path.read_text()
        new = rewrite(text, imports_only=not everything and _imports_only(path))
        if new != text:
            path.write_text(new)
            changed += 1
    print(f"rewrote {changed} files")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
