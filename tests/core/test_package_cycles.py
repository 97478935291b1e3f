"""No cycle between ``llmrs_core``'s subpackages at import time (issue 31: the ``ab <-> bench <-> server``
cycle the misplaced router, ``make observe`` and the shared statistics made).

The graph is read from the source, not by importing (fast, and blind to which extras are
installed): an edge A -> B where a module of subpackage A imports one of B *eagerly* — at module
level, class bodies included, ``if TYPE_CHECKING:`` blocks and function bodies not (those run
later, or never). Importing ``llmrs_core.b.c`` runs ``llmrs_core/b/__init__.py`` first, so it is
an edge to B whichever module of B is named. Loose top-level modules (``loader``, ``config``, the
package's own ``__init__``) belong to no subpackage: an import passes through them, so
A -> loader -> B is the edge A -> B. A cycle is a strongly connected set of two or more subpackages.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "llmrs_core"
PACKAGE = "llmrs_core"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _eager_statements(body: list[ast.stmt]):
    """The statements that run when the module is imported (function bodies and TYPE_CHECKING blocks left out)."""
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            yield from _eager_statements(node.orelse)
            continue
        yield node
        for field in ("body", "orelse", "finalbody", "handlers"):
            inner = getattr(node, field, None)
            if isinstance(inner, list):
                yield from _eager_statements([n for n in inner if isinstance(n, ast.AST)])


def eager_imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The ``llmrs_core`` modules that importing ``name`` imports at once (submodules of a ``from``
    import included)."""
    is_package = path.name == "__init__.py"
    out: set[str] = set()
    for node in _eager_statements(ast.parse(path.read_text(), str(path)).body):
        if isinstance(node, ast.ExceptHandler):
            continue
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.split(".")[0] == PACKAGE}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != PACKAGE:
                continue
            out.add(target)
            out |= {f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in known}
    # importing a.b.c runs a.b's __init__ first: the packages along the way are imported too
    return {".".join(m.split(".")[:i]) for m in out for i in range(2, m.count(".") + 2)}


def room(module: str) -> str | None:
    """The subpackage a module belongs to (``llmrs_core.kernels.cpu.int8`` -> ``kernels``), or None
    for the package's loose top-level modules and its ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and (ROOT / parts[1]).is_dir() else None


def package_graph() -> dict[tuple[str, str], list[str]]:
    """``(A, B) -> [the import chains that make A -> B]``, A != B."""
    mods = modules()
    imports = {m: eager_imports(m, p, set(mods)) for m, p in mods.items()}
    edges: dict[tuple[str, str], list[str]] = {}
    for start in mods:
        if room(start) is None:
            continue
        seen, frontier = {start}, [(start, [start])]
        while frontier:
            m, chain = frontier.pop()
            for nxt in sorted(imports.get(m, ())):
                if nxt in seen or nxt not in mods:
                    continue
                seen.add(nxt)
                if room(nxt) is None:  # a loose module: the import goes on through it
                    frontier.append((nxt, chain + [nxt]))
                elif room(nxt) != room(start):
                    edges.setdefault((room(start), room(nxt)), []).append(" -> ".join(chain + [nxt]))
    return edges


def cycles(edges: dict[tuple[str, str], list[str]]) -> list[list[str]]:
    """The strongly connected sets of two or more subpackages (Tarjan), each sorted."""
    graph: dict[str, set[str]] = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
        graph.setdefault(b, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_cycle_between_subpackages_at_import_time():
    edges = package_graph()
    found = cycles(edges)
    why = [f"{a} -> {b}: {edges[a, b][0]}" for group in found for a in group for b in group if (a, b) in edges]
    assert not found, f"subpackages that import each other eagerly: {found}\n" + "\n".join(why)


def test_the_graph_sees_eager_edges_and_not_lazy_ones():
    """Known edges, so that the test above cannot pass on an empty graph: the CLI imports the A/B
    commands at module level; the benchmarks import the server only inside functions."""
    edges = package_graph()
    assert ("cli", "ab") in edges and ("ab", "bench") in edges and ("ab", "server") in edges
    assert ("bench", "server") not in edges and ("bench", "ab") not in edges


@pytest.mark.parametrize("graph, want", [
    ({("a", "b"): [], ("b", "c"): [], ("c", "a"): []}, [["a", "b", "c"]]),
    ({("a", "b"): [], ("b", "c"): []}, []),
    ({("a", "b"): [], ("b", "a"): [], ("c", "d"): []}, [["a", "b"]]),
])
def test_cycles_finds_strongly_connected_sets(graph, want):
    assert cycles(graph) == want
