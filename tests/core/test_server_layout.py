"""The server's shape (issue 31): small functions, and the engine read through one declared interface.

Source checks (no server is started): every function in ``llmrs_core/server`` is at most
``MAX_FUNCTION_LINES`` long, ``create_app`` only wires (no handler nested in it), and no
server module reads the engine's scheduler, block pool, prefix cache or request table: the
metrics, request log and loop read ``Engine.step_stats()`` (``StepStats``) instead.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SERVER = Path(__file__).resolve().parents[2] / "llmrs_core" / "server"
MAX_FUNCTION_LINES = 80
#: the engine's internals the server must not read (``Engine.step_stats`` has what it needs)
ENGINE_INTERNALS = {"scheduler", "prefix_cache", "tables"}
FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)


def server_modules() -> list[Path]:
    return sorted(SERVER.rglob("*.py"))


def parsed(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def function_lengths(tree: ast.Module) -> list[tuple[str, int, int]]:
    """``(name, first line, length in lines)`` of every function and method, nested ones too."""
    return [(node.name, node.lineno, node.end_lineno - node.lineno + 1)
            for node in ast.walk(tree) if isinstance(node, FUNCTIONS)]


def test_the_length_count_sees_a_long_function():
    long_source = "def f():\n" + "    x = 1\n" * (MAX_FUNCTION_LINES + 1)
    assert function_lengths(ast.parse(long_source)) == [("f", 1, MAX_FUNCTION_LINES + 2)]


def test_the_server_package_is_found():
    names = {p.name for p in server_modules()}
    assert {"app.py", "loop.py", "supervisor.py", "metrics.py"} <= names


@pytest.mark.parametrize("path", server_modules(), ids=lambda p: str(p.relative_to(SERVER)))
def test_no_server_function_is_over_the_limit(path):
    too_long = [f"{name} (line {line}): {n} lines" for name, line, n in function_lengths(parsed(path))
                if n > MAX_FUNCTION_LINES]
    assert not too_long, f"{path.name}: functions over {MAX_FUNCTION_LINES} lines: {too_long}"


def test_create_app_only_wires():
    tree = parsed(SERVER / "app.py")
    create_app = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "create_app")
    handlers = [n.name for n in ast.walk(create_app) if isinstance(n, ast.AsyncFunctionDef)]
    assert not handlers, f"create_app defines handlers {handlers}: they belong in llmrs_core/server/routes"


def engine_internals_read(tree: ast.Module) -> list[str]:
    """Attribute reads of the engine's internals: ``x.scheduler``, ``x.prefix_cache``,
    ``x.tables``, and ``engine.requests`` (the request table; ``submission.requests`` is not it)."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        on_engine = isinstance(node.value, ast.Name) and node.value.id in ("engine", "fresh") or (
            isinstance(node.value, ast.Attribute) and node.value.attr == "engine")
        if node.attr in ENGINE_INTERNALS or (node.attr == "requests" and on_engine):
            found.append(f"line {node.lineno}: .{node.attr}")
    return found


def test_the_internals_check_sees_a_read():
    assert engine_internals_read(ast.parse("engine.requests[rid]; engine.scheduler.waiting")) == [
        "line 1: .requests", "line 1: .scheduler"]
    assert engine_internals_read(ast.parse("s.requests; stats.requests")) == []


@pytest.mark.parametrize("path", server_modules(), ids=lambda p: str(p.relative_to(SERVER)))
def test_the_server_reads_the_engine_through_step_stats(path):
    assert not engine_internals_read(parsed(path)), (
        f"{path.name} reads the engine's internals {engine_internals_read(parsed(path))}: "
        "use Engine.step_stats() (llmrs_core/engine/stats.py)")
