"""The type table's room: ``config``, ``formats`` and ``quant`` import one another in one direction only.

``config`` once reached the ggml type table through ``formats/`` while ``formats/hf.py`` imports
``config``: a cycle between the two (issue 31). The table lives in ``quant/types.py`` now. These
tests fail on the next back-edge: at run time (a fresh interpreter imports one module and we look
at what came with it) and statically (the eager imports between the three packages).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import llmrs_core

PACKAGE = Path(llmrs_core.__file__).parent
ROOMS = ("config", "formats", "quant")

# Imports ``module`` without running llmrs_core/__init__.py (which imports the whole engine), then
# prints every llmrs_core module that came with it.
_PROBE = """
import importlib, sys, types
pkg = types.ModuleType("llmrs_core"); pkg.__path__ = [{path!r}]; sys.modules["llmrs_core"] = pkg
importlib.import_module({module!r})
print("\\n".join(sorted(m for m in sys.modules if m.startswith("llmrs_core."))))
"""


def _loaded_with(module: str) -> set[str]:
    code = _PROBE.format(path=str(PACKAGE), module=module)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return set(done.stdout.split())


@pytest.mark.parametrize(
    ("module", "forbidden"),
    [
        ("llmrs_core.config", "llmrs_core.formats"),
        ("llmrs_core.quant.types", "llmrs_core.formats"),
        ("llmrs_core.formats.gguf", "llmrs_core.config"),
        ("llmrs_core.formats.gguf_writer", "llmrs_core.config"),
    ],
)
def test_a_fresh_import_does_not_need_the_other_room(module, forbidden):
    loaded = _loaded_with(module)
    assert module in loaded
    assert not {m for m in loaded if m == forbidden or m.startswith(forbidden + ".")}, (
        f"importing {module} imports {forbidden}: {sorted(loaded)}"
    )


def _eager_imports(path: Path) -> set[str]:
    """The llmrs_core modules ``path`` imports when it is imported: not inside a function, a class
    or an ``if TYPE_CHECKING:`` block."""
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    base = parts if parts[-1] == "__init__" else parts[:-1]
    base = [p for p in base if p != "__init__"]
    found: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        for n in ast.walk(node):
            if isinstance(n, ast.Import):
                found.update(a.name for a in n.names)
            elif isinstance(n, ast.ImportFrom):
                prefix = base[: len(base) - n.level + 1] if n.level else []
                found.add(".".join(prefix + ([n.module] if n.module else [])))
    return {m for m in found if m.startswith("llmrs_core.")}


def _room(module: str) -> str:
    """``llmrs_core.formats.gguf`` -> ``formats``; ``llmrs_core.config`` -> ``config``."""
    return module.split(".")[1]


def test_the_three_rooms_import_one_another_one_way():
    edges: dict[tuple[str, str], set[tuple[str, str]]] = {}
    for path in PACKAGE.rglob("*.py"):
        here = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        for target in _eager_imports(path):
            a, b = _room(here), _room(target)
            if a != b and a in ROOMS and b in ROOMS:
                edges.setdefault((a, b), set()).add((here, target))
    reach = {(a, b) for a, b in edges}
    for _ in ROOMS:  # the transitive closure, three rooms deep
        reach |= {(a, c) for a, b in reach for b2, c in reach if b == b2}
    cycles = sorted((a, b) for a, b in reach if a < b and (b, a) in reach)
    assert not cycles, {f"{a} -> {b}": sorted(why) for (a, b), why in edges.items()}
    assert ("config", "quant") in edges, "the test no longer sees the import it guards: update it"
