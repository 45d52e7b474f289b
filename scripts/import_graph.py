"""Print pitstop's import cycles and the imports between its top-level parts.

    PYTHONPATH=src .venv/bin/python scripts/import_graph.py [--arrows]

Built with grimp (what import-linter checks), so every import counts: module level, inside functions,
and under ``if TYPE_CHECKING``. A cycle is a strongly connected component of the module graph, listed
with the imports inside it (importer -> imported, line, name). ``--arrows`` adds, for each pair of
top-level parts (a subpackage or a module of ``pitstop``), the module imports from one to the other.
"""

from __future__ import annotations

import sys
from collections import defaultdict

import grimp

PACKAGE = "pitstop"


def strongly_connected(graph: grimp.ImportGraph) -> list[list[str]]:
    """The graph's cycles: each strongly connected component of more than one module, sorted (Tarjan's
    algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            nxt = next(edges, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.find_modules_directly_imported_by(nxt)))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def describe_cycle(graph: grimp.ImportGraph, component: list[str]) -> list[str]:
    """The imports inside one cycle, one line each."""
    members = set(component)
    lines = []
    for importer in component:
        for imported in sorted(graph.find_modules_directly_imported_by(importer) & members):
            for d in graph.get_import_details(importer=importer, imported=imported):
                lines.append(f"  {importer} -> {imported} (line {d['line_number']}: {d['line_contents']})")
    return lines


def part(module: str) -> str:
    """The top-level part of ``pitstop`` a module belongs to."""
    return ".".join(module.split(".")[:2])


def arrows(graph: grimp.ImportGraph) -> dict[tuple[str, str], list[str]]:
    """(importing part, imported part) -> the module imports between them."""
    out: dict[tuple[str, str], list[str]] = defaultdict(list)
    for importer in sorted(graph.modules):
        for imported in sorted(graph.find_modules_directly_imported_by(importer)):
            if part(importer) != part(imported):
                out[(part(importer), part(imported))].append(f"{importer} -> {imported}")
    return dict(out)


def main(argv: list[str]) -> int:
    graph = grimp.build_graph(PACKAGE, cache_dir=None)
    cycles = strongly_connected(graph)
    print(f"{len(graph.modules)} modules, {len(cycles)} import cycles")
    for component in cycles:
        print(f"cycle of {len(component)} modules:")
        print("\n".join(describe_cycle(graph, component)))
    if "--arrows" in argv:
        for (a, b), imports in sorted(arrows(graph).items()):
            print(f"{a} -> {b}: {len(imports)}")
            print("\n".join(f"  {i}" for i in imports))
    return 1 if cycles else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
