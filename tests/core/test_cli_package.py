"""The ``llmrs`` CLI package's structure (issue 31): its dispatch table is the parser's commands, in
``--help`` order; ``python -m llmrs_core.cli`` is the same CLI; and every other ``python -m``
entry point of the package is listed in one place (the table of the CLI package's docstring,
repeated in the README), so that a new one is not missed.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

import llmrs_core.cli as cli

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "llmrs_core"
MAIN = re.compile(r'^if __name__ == "__main__":', re.M)


def entry_points() -> set[str]:
    """``llmrs_core.x.y`` for each module with a ``__main__`` block (the CLI's own left out: ``llmrs``)."""
    found = set()
    for path in PACKAGE.rglob("*.py"):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        if path.name == "__main__.py" or name.startswith("llmrs_core.cli"):
            continue
        if MAIN.search(path.read_text()):
            found.add(name)
    return found


def test_every_python_m_entry_point_is_listed_in_the_cli_docstring_and_the_readme():
    points = entry_points()
    assert len(points) >= 5, points  # the scan finds them: observe, entrypoint, profile, ...
    readme = (ROOT / "README.md").read_text()
    missing_doc = sorted(p for p in points if not re.search(rf"^    {re.escape(p)}\s", cli.__doc__, re.M))
    missing_readme = sorted(p for p in points if f"| `{p}` |" not in readme)
    assert not missing_doc, f"list these in llmrs_core/cli/__init__.py's docstring: {missing_doc}"
    assert not missing_readme, f"list these in the README's table of python -m entry points: {missing_readme}"


def test_listed_entry_points_exist():
    listed = re.findall(r"^    (llmrs_core\.[\w.]+)\s", cli.__doc__, re.M)
    assert set(listed) == entry_points()


def test_the_dispatch_table_is_the_parsers_commands_in_help_order():
    parser = cli.build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    assert list(sub.choices) == list(cli.COMMANDS)
    for name, command in sub.choices.items():
        assert callable(command.get_default("func")), name


def test_python_m_llmrs_core_cli_is_the_same_cli():
    done = subprocess.run([sys.executable, "-m", "llmrs_core.cli", "--help"], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == cli.build_parser().format_help().split()
