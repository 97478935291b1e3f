"""``make reset E=3.6``: put back one exercise's stubs, after backing up the learner's file.

The stubs come from git (``git show HEAD:chapters/chNN_*/exercises.py``, or
another revision with ``--rev``): every top-level function or class of that
file whose stubs belong to the exercise replaces the learner's definition of
the same name; a class whose methods span several exercises has only that
exercise's methods replaced. Everything else in the learner's file — other
exercises, imports, helpers they added — stays as it is. The whole file is
first copied to ``exercises.py.<exercise>-<time>.bak`` beside it, and the
command names that file. Where the exercise's definitions are still the stubs,
nothing is written and no backup made: the command says so.

Run it as ``python -m llmrs_core.workbook.reset 3.6 [--rev REV]``.
"""

from __future__ import annotations

import argparse
import ast
import shutil
import sys
import time
from pathlib import Path

from . import (
    chapter_exercises,
    committed_source,
    exercises_path,
    find_root,
    find_stubs,
    parse_exercise,
    say_exercises,
)


class ResetError(Exception):
    """Why an exercise cannot be reset (nothing was changed)."""


def _span(node: ast.stmt) -> tuple[int, int]:
    """0-based ``[start, stop)`` line range of a definition, decorators included."""
    start = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))]) - 1
    return start, node.end_lineno


def _definitions(body: list[ast.stmt]) -> dict[str, ast.stmt]:
    return {n.name: n for n in body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}


def _replacements(given: str, current: str, exercise: str) -> tuple[list[tuple[tuple[int, int] | None, str]], list[str]]:
    """What to put back: ``[(span in current or None to append, text)]`` and the names restored."""
    given_lines, given_tree = given.splitlines(keepends=True), ast.parse(given)
    mine = {s.qualname for s in find_stubs(given) if s.exercise == exercise}
    others = {s.qualname for s in find_stubs(given) if s.exercise != exercise}
    current_defs = _definitions(ast.parse(current).body)
    out: list[tuple[tuple[int, int] | None, str]] = []
    names: list[str] = []

    def text(node: ast.stmt) -> str:
        a, b = _span(node)
        return "".join(given_lines[a:b])

    for name, node in _definitions(given_tree.body).items():
        inside = {q for q in mine if q == name or q.startswith(name + ".")}
        if not inside:
            continue
        theirs = current_defs.get(name)
        mixed = isinstance(node, ast.ClassDef) and any(q.startswith(name + ".") for q in others)
        if not mixed or theirs is None or not isinstance(theirs, ast.ClassDef):
            out.append((_span(theirs) if theirs is not None else None, text(node)))
            names.append(name)
            continue
        their_methods = _definitions(theirs.body)
        for method, m_node in _definitions(node.body).items():
            if f"{name}.{method}" in mine:
                if method not in their_methods:
                    raise ResetError(f"your class {name} has no method {method} to put the stub back into")
                out.append((_span(their_methods[method]), text(m_node)))
                names.append(f"{name}.{method}")
    return out, names


def reset_exercise(exercise: str, root: Path | None = None, rev: str = "HEAD") -> tuple[Path | None, list[str]]:
    """Put back the stubs of ``exercise`` (``"3.6"``) in the learner's ``exercises.py``.

    Returns the backup of the learner's whole file and the names restored; the backup is
    None, and the file unchanged, where every one of them is still the stub.
    Raises :class:`ResetError` (changing nothing) for an unknown exercise, a
    revision without stubs for it, or a file that does not parse.
    """
    root = root or find_root()
    try:
        chapter, exercise = parse_exercise(exercise)
        path = exercises_path(chapter, root)
    except ValueError as e:
        raise ResetError(str(e)) from None
    known = chapter_exercises(chapter, root) if path.exists() else {}
    if exercise not in known:
        raise ResetError(f"there is no Exercise {exercise}: {say_exercises(chapter, known)}")
    try:
        given = committed_source(path, root, rev)
    except LookupError as e:
        raise ResetError(f"cannot find the stubs in git: {str(e).rstrip('.')}") from None
    if not any(s.exercise == exercise for s in find_stubs(given)):
        raise ResetError(
            f"{path.relative_to(root)} at {rev} has no stubs of Exercise {exercise} (was your solution "
            "committed?); name a revision that has them: make reset E=... REV=<commit>"
        )
    current = path.read_text()
    try:
        edits, names = _replacements(given, current, exercise)
    except SyntaxError as e:
        raise ResetError(
            f"{path.relative_to(root)} does not parse (line {e.lineno}: {e.msg}); fix that first, "
            f"or put back the whole file with `git checkout {rev} -- {path.relative_to(root)}`"
        ) from None
    lines = current.splitlines(keepends=True)
    if all(span is not None and "".join(lines[span[0] : span[1]]) == new for span, new in edits):
        return None, names  # never touched: a backup would only be a copy of the stubs
    backup = path.with_name(f"{path.name}.{exercise}-{time.strftime('%Y%m%d-%H%M%S')}.bak")
    shutil.copy2(path, backup)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    appended = [t for span, t in edits if span is None]
    for span, new in sorted((e for e in edits if e[0] is not None), key=lambda e: e[0][0], reverse=True):
        lines[span[0] : span[1]] = [new]
    path.write_text("".join(lines) + "".join("\n\n" + t for t in appended))
    return backup, names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make reset", description=__doc__.splitlines()[0])
    parser.add_argument("exercise", help="the exercise, e.g. 3.6")
    parser.add_argument("--rev", default="HEAD", help="the git revision whose stubs to put back (default HEAD)")
    args = parser.parse_args(argv)
    try:
        backup, names = reset_exercise(args.exercise, rev=args.rev)
    except ResetError as e:
        print(f"make reset: {e}; nothing was changed.", file=sys.stderr)
        return 1
    root = find_root()
    chapter = int(args.exercise.split(".")[0])
    where = exercises_path(chapter, root).relative_to(root)
    if backup is None:
        print(f"Exercise {args.exercise} is still the stubs in {where} ({', '.join(names)}): nothing to put "
              "back, so nothing was changed and no backup made.")
        return 0
    print(f"Your exercises.py is saved as {backup.relative_to(root)}.")
    print(f"Exercise {args.exercise}'s stubs are back in {exercises_path(chapter, root).relative_to(root)}: "
          f"{', '.join(names)}.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
