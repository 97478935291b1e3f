"""Every file in the room its job names (issue 31): the engine imports none of the other rooms.

The rooms of ``llmrs_core`` (the README's Layout section draws them):

* **tooling**: the ``llmrs`` command (``cli/``, ``__main__``), the benchmarks (``bench/``), the A/B test
  (``ab/``) and operations (``ops/``);
* **workbook**: the learner's harness (``workbook/``, ``testing/``, ``profiling``);
* **labs**: teaching-only kernels and pools (``labs/``);
* **engine**: everything else, what ``load()``, ``Engine`` and ``llmrs serve`` run.

The imports are read from the source (every ``import``, at the top or inside a function), so the
test sees a back-edge that only a rarely taken branch would import.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "llmrs_core"
ROOMS = {
    "tooling": ("llmrs_core.cli", "llmrs_core.__main__", "llmrs_core.bench", "llmrs_core.ab", "llmrs_core.ops"),
    "workbook": ("llmrs_core.workbook", "llmrs_core.testing", "llmrs_core.profiling"),
    "labs": ("llmrs_core.labs",),
}


def room_of(module: str) -> str:
    for room, prefixes in ROOMS.items():
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return room
    return "engine"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """The absolute names of the ``llmrs_core`` modules ``path`` imports, anywhere in it."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")
            base = base[: len(base) - node.level + 1] if node.level else []
            stem = ".".join(base + ([node.module] if node.module else []))
            found |= {stem} | {f"{stem}.{a.name}" for a in node.names}
    return {m for m in found if m == "llmrs_core" or m.startswith("llmrs_core.")}


#: the one door from the engine into another room: ``load(backend="learner")`` (and ``--impl learner``)
#: asks for the workbook's backend by name, and ``get_backend`` imports it then, inside the call
DOORS = {("llmrs_core.backends", "llmrs_core.workbook.learner"),
         ("llmrs_core.backends", "llmrs_core.workbook.learner.LearnerBackend")}


def engine_back_edges() -> list[str]:
    edges = []
    for path in sorted(PACKAGE.rglob("*.py")):
        here = module_name(path)
        if room_of(here) != "engine":
            continue
        for target in sorted(imports_of(path)):
            if room_of(target) != "engine" and (here, target) not in DOORS:
                edges.append(f"{here} imports {target} ({room_of(target)})")
    return edges


def test_the_engine_imports_no_other_room():
    edges = engine_back_edges()
    assert not edges, "the engine must not import the tooling, the workbook or the labs:\n" + "\n".join(edges)


def test_the_scan_sees_imports_at_any_depth(tmp_path, monkeypatch):
    """The check can fail: a relative import inside a function of an engine module is found."""
    fake = tmp_path / "llmrs_core"
    (fake / "engine").mkdir(parents=True)
    (fake / "engine" / "__init__.py").write_text("")
    (fake / "engine" / "x.py").write_text("def f():\n    from ..workbook import report\n    import llmrs_core.labs.ring\n")
    monkeypatch.setattr(__import__(__name__), "PACKAGE", fake)
    assert engine_back_edges() == [
        "llmrs_core.engine.x imports llmrs_core.labs.ring (labs)",
        "llmrs_core.engine.x imports llmrs_core.workbook (workbook)",
        "llmrs_core.engine.x imports llmrs_core.workbook.report (workbook)",
    ]


@pytest.mark.parametrize("room", list(ROOMS))
def test_every_room_exists(room):
    """A renamed package would empty a room and make the first test pass for nothing."""
    assert any((PACKAGE.parent / (p.replace(".", "/") + s)).exists()
               for p in ROOMS[room] for s in ("", ".py")), room
