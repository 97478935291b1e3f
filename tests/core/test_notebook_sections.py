"""The chapter notebooks' exercise sections stand on their own (issue 19, section 5).

A learner who opens a notebook, runs its first code cell and jumps to a
Try-It-Yourself section must be able to run that section from its first
cell down, without a ``NameError`` for something an earlier section built.
This is checked statically, with ``ast`` over the cells' sources (nothing is
executed): every name a section's code reads is bound in the notebook's first
code cell, in the section itself (its setup cell first), or is a builtin. Sections
beyond the book (``## 2.6 Beyond the book — ...``) make the same promise and are checked the same way.

The same tests hold the other promises of the exercise sections: their hints
are tiered ``<details>`` blocks, a stored ``run_tests`` output says that it
is the reference solutions' run, not the learner's, and the number of tests it
reports is the number the exercise has today (pytest collects them once, in a
subprocess).
"""

from __future__ import annotations

import ast
import builtins
import json
import os
import re
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from llmrs_core import workbook
from llmrs_core.workbook import REFERENCE_RUN, TEST_NAME, parse_exercise

ROOT = Path(__file__).resolve().parents[2]
#: the chapters whose notebooks this checks
CHAPTERS = tuple(range(1, 13))
#: names a notebook cell may read without binding them (IPython's own)
IPYTHON_NAMES = {"display", "get_ipython", "In", "Out"}


def notebooks() -> list[Path]:
    found = []
    for chapter in CHAPTERS:
        found += sorted(ROOT.glob(f"chapters/ch{chapter:02d}_*/ch{chapter:02d}_*.ipynb"))
    return found


@dataclass
class Section:
    """A ``## N.M`` section: its title line and its cells, header cell included."""

    title: str
    cells: list[dict] = field(default_factory=list)

    def code(self) -> list[str]:
        return [source(c) for c in self.cells if c["cell_type"] == "code"]

    @property
    def is_exercise(self) -> bool:
        return any(re.search(r"\b(exercises|run_tests)\(", src) for src in self.code())

    def markdown(self) -> str:
        return "\n".join(source(c) for c in self.cells if c["cell_type"] == "markdown")


def source(cell: dict) -> str:
    src = cell["source"]
    return src if isinstance(src, str) else "".join(src)


def sections(nb: dict) -> tuple[list[dict], list[Section]]:
    """The cells before the first ``## `` header, and the sections from there on."""
    before: list[dict] = []
    found: list[Section] = []
    for cell in nb["cells"]:
        header = None
        if cell["cell_type"] == "markdown":
            header = next((line for line in source(cell).splitlines() if line.startswith("## ")), None)
        if header is not None:
            found.append(Section(header[3:].strip()))
        (found[-1].cells if found else before).append(cell)
    return before, found


def first_code_cell(nb: dict) -> str:
    return next(source(c) for c in nb["cells"] if c["cell_type"] == "code")


def bound_names(tree: ast.AST) -> set[str]:
    """Every name the code binds anywhere (assignments, loop and ``with`` targets, imports, defs,
    arguments, ``except ... as``): generous on purpose, so that only a name that nothing in the
    allowed cells binds is reported."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
    return names


def read_names(tree: ast.AST) -> dict[str, int]:
    """``{name: first line}`` of every name the code reads."""
    names: dict[str, int] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            names.setdefault(node.id, node.lineno)
    return names


def parse(src: str, where: str) -> ast.Module:
    # IPython magics and shell escapes are not Python; the notebooks use none, and the
    # check would rather say so than guess what they bind
    try:
        return ast.parse(src)
    except SyntaxError as e:
        raise AssertionError(f"{where}: not plain Python ({e.msg}, line {e.lineno})") from None


def undefined_names(first_cell: str, section: Section, where: str) -> list[str]:
    """What a learner who ran only ``first_cell`` and then the section, top to bottom, would
    get a ``NameError`` for: ``["cell 3 of the section reads 'text_ids' (line 2)", ...]``."""
    known = set(dir(builtins)) | IPYTHON_NAMES | bound_names(parse(first_cell, f"{where}, first code cell"))
    problems = []
    for n, src in enumerate(section.code(), start=1):
        tree = parse(src, f"{where}, code cell {n}")
        known |= bound_names(tree)  # within one cell, order is the learner's business
        for name, line in read_names(tree).items():
            if name not in known:
                problems.append(f"code cell {n} of the section reads {name!r} (line {line}), which neither "
                                f"the notebook's first code cell nor this section defines")
    return problems


def exercise_sections(path: Path) -> tuple[str, list[Section]]:
    nb = json.loads(path.read_text())
    _, found = sections(nb)
    return first_code_cell(nb), [s for s in found if s.is_exercise]


def section_ids() -> list[tuple[Path, str]]:
    return [(path, s.title) for path in notebooks() for s in exercise_sections(path)[1]]


SECTIONS = section_ids()


def _section(path: Path, title: str) -> tuple[str, Section]:
    first, found = exercise_sections(path)
    return first, next(s for s in found if s.title == title)


def test_every_chapter_notebook_has_exercise_sections():
    assert len(notebooks()) == len(CHAPTERS), "a chapter notebook is missing"
    chapters_with_sections = {path.parent.name for path, _ in SECTIONS}
    assert chapters_with_sections == {path.parent.name for path in notebooks()}


def beyond_the_book_ids() -> list[tuple[Path, str]]:
    """The ``## N.M Beyond the book — ...`` sections (chapter 2's 2.6): they promise to stand alone too."""
    found = []
    for path in notebooks():
        nb = json.loads(path.read_text())
        found += [(path, s.title) for s in sections(nb)[1] if "beyond the book" in s.title.lower()]
    return found


BEYOND = beyond_the_book_ids()


@pytest.mark.parametrize(("path", "title"), BEYOND, ids=[t.split(" ")[0] for _, t in BEYOND])
def test_beyond_the_book_section_runs_after_the_first_cell_alone(path, title):
    nb = json.loads(path.read_text())
    section = next(s for s in sections(nb)[1] if s.title == title)
    problems = undefined_names(first_code_cell(nb), section, f"{path.name} §{title}")
    assert not problems, f"{path.name} §{title} is not self-contained:\n  " + "\n  ".join(problems)


@pytest.mark.parametrize(("path", "title"), SECTIONS, ids=[t.split(" ")[0] for _, t in SECTIONS])
def test_exercise_section_runs_after_the_first_cell_alone(path, title):
    first, section = _section(path, title)
    problems = undefined_names(first, section, f"{path.name} §{title}")
    assert not problems, (
        f"{path.name} §{title} is not self-contained; a learner jumping to it gets a NameError:\n  "
        + "\n  ".join(problems)
        + "\nbuild what the section needs in its setup cell (its first code cell)"
    )


@pytest.mark.parametrize(("path", "title"), SECTIONS, ids=[t.split(" ")[0] for _, t in SECTIONS])
def test_exercise_hints_are_tiered_and_collapsed(path, title):
    _, section = _section(path, title)
    text = section.markdown()
    details = re.findall(r"<details>\s*<summary>(.*?)</summary>", text, re.DOTALL)
    assert len(details) >= 2, (
        f"{path.name} §{title}: hints belong in collapsed <details> blocks, tiered (idea, then API, "
        f"then a code-shaped hint); found {len(details)}"
    )
    assert not re.search(r"^\*\*Hints?\.?\*\*", text, re.MULTILINE), (
        f"{path.name} §{title}: an open **Hints** list shows the hints before the learner asks"
    )


@pytest.mark.parametrize(("path", "title"), SECTIONS, ids=[t.split(" ")[0] for _, t in SECTIONS])
def test_stored_test_runs_say_they_are_the_reference(path, title):
    _, section = _section(path, title)
    for cell in section.cells:
        if cell["cell_type"] != "code" or "run_tests(" not in source(cell):
            continue
        text = "".join("".join(o.get("text", "")) for o in cell.get("outputs", []))
        assert text.startswith(REFERENCE_RUN), (
            f"{path.name} §{title}: the stored run_tests output reads as if the learner's work were done "
            f"({text[:60]!r}); store it from a run where run_tests labels it as the reference"
        )


# -- stored run_tests counts: the number of tests the exercise has today ------------------

#: collects the chapter test folders given as arguments as ``run_tests`` would run them (the
#: solutions), and prints their node ids as JSON; the terminal plugin is off, so the workbook's
#: report (which has nothing to say about a run that ran nothing) stays out of it, and the
#: assertions are not rewritten (nothing runs them): half the time
_COLLECT = """
import json, sys
import pytest

class Items:
    ids, errors = None, []
    def pytest_collectreport(self, report):
        if report.failed:
            self.errors.append(f"{report.nodeid}: {report.longreprtext[-1500:]}")
    def pytest_collection_finish(self, session):
        self.ids = [item.nodeid for item in session.items]

items = Items()
rc = pytest.main([*sys.argv[1:], "--collect-only", "--impl", "solutions", "--assert=plain",
                  "-p", "no:terminal", "-p", "no:cacheprovider", "-p", "no:nbval"], plugins=[items])
print(json.dumps({"rc": int(rc), "ids": items.ids, "errors": items.errors}))
"""
#: pytest's outcome words that count a selected test ("7 deselected" does not)
_OUTCOMES = re.compile(r"\b(\d+) (passed|failed|skipped|xfailed|xpassed|errors?)\b")


def stored_test_runs() -> list[tuple[Path, str, str]]:
    """``(notebook, "5.6", stored output)`` for every ``run_tests("N.M")`` cell of the notebooks."""
    found = []
    for path in notebooks():
        for cell in json.loads(path.read_text())["cells"]:
            if cell["cell_type"] != "code":
                continue
            for m in re.finditer(r"""\brun_tests\(\s*["'](\d+\.\d+)["']""", source(cell)):
                text = "".join("".join(o.get("text", "")) for o in cell.get("outputs", []))
                found.append((path, m.group(1), text))
    return found


STORED_RUNS = stored_test_runs()


def exercise_test_counts(node_ids: list[str]) -> Counter:
    """``{(5, "5.6"): 9, ..., (5, None): 21}``: how many collected tests each exercise has in its
    chapter's folder (``tests/ch05/...::test_ex5_6_...[case]``), the tests ``run_tests("5.6")``
    selects, and under ``None`` all the folder's tests (the rest are the run's deselected ones)."""
    counts: Counter = Counter()
    for node in node_ids:
        folder = re.match(r"tests/ch(\d\d)/", node)
        if not folder:
            continue
        counts[int(folder.group(1)), None] += 1
        if name := TEST_NAME.match(node.rpartition("::")[2]):
            counts[int(folder.group(1)), f"{int(name['n'])}.{int(name['m'])}"] += 1
    return counts


def counts_in(report: str) -> tuple[int, int] | None:
    """``(ran, deselected)`` from a stored report: ``"9 passed, 2 skipped, 7 deselected in 1.2s"``
    gives ``(11, 7)``; ``None`` when it names no outcome."""
    found = _OUTCOMES.findall(report)
    if not found:
        return None
    deselected = re.search(r"\b(\d+) deselected\b", report)
    return sum(int(n) for n, _ in found), int(deselected.group(1)) if deselected else 0


@pytest.fixture(scope="module")
def collected() -> Counter:
    folders = sorted({f"tests/ch{parse_exercise(e)[0]:02d}" for _, e, _ in STORED_RUNS})
    env = {"OPENBLAS_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1", **os.environ}
    try:
        proc = subprocess.run([sys.executable, "-c", _COLLECT, *folders], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        pytest.fail("collecting the chapter tests took over 300 s")
    lines = proc.stdout.strip().splitlines()
    result = json.loads(lines[-1]) if lines and lines[-1].startswith("{") else None
    assert result and result["rc"] == 0 and result["ids"], (
        f"collecting {' '.join(folders)} failed (exit status {proc.returncode}):\n"
        + ("\n".join(result["errors"]) if result and result["errors"] else proc.stdout[-2000:] + proc.stderr[-2000:])
    )
    return exercise_test_counts(result["ids"])


@pytest.mark.parametrize(("path", "exercise", "text"), STORED_RUNS, ids=[e for _, e, _ in STORED_RUNS])
def test_stored_test_runs_report_todays_number_of_tests(path, exercise, text, collected):
    chapter, _ = parse_exercise(exercise)
    report = next((line for line in text.splitlines() if line.startswith(f"Exercise {exercise} ")), "")
    assert "all tests pass" in report, (
        f"{path.name}: the stored run_tests({exercise!r}) output is not a passing reference run "
        f"({report or text[:200]!r}); fix what fails, then execute the notebook again "
        f"(`.venv/bin/python scripts/refresh_notebooks.py {path.relative_to(ROOT)}`)"
    )
    ran = collected[chapter, exercise]
    want, stored = (ran, collected[chapter, None] - ran), counts_in(report)
    assert stored == want, (
        f"{path.name}: the stored run_tests({exercise!r}) output reports {stored[0]} tests run and "
        f"{stored[1]} deselected, but today tests/ch{chapter:02d} has {want[0]} for Exercise {exercise} "
        f"and {want[1]} others: the output is stale; execute the notebook again "
        f"(`.venv/bin/python scripts/refresh_notebooks.py {path.relative_to(ROOT)}`)"
        if stored else f"{path.name}: the stored run_tests({exercise!r}) output names no test count: {report!r}"
    )


# -- the check itself: it finds what a learner jumping to a section meets ---------------


def _notebook(*cells: tuple[str, str]) -> dict:
    return {"cells": [{"cell_type": kind, "source": src, "metadata": {}, "outputs": []} for kind, src in cells]}


def test_check_reports_a_name_from_an_earlier_section():
    # §5.6 as it was: its cells read text_ids and naive_s, which only §5.1 built
    nb = _notebook(
        ("code", "from llmrs_core.workbook import exercises, run_tests\nimport llmrs_core as llmrs"),
        ("markdown", "## 5.1 Why naive inference is quadratic"),
        ("code", "model = llmrs.load()\ntext_ids = model.tokenizer.encode('x')\nnaive_s = 1.0"),
        ("markdown", "## 5.6 Try It Yourself — Exercise 5.6"),
        ("code", "ex = exercises(5)\ncache = ex.ContiguousKVCache(model.config)"),
        ("code", "print(len(text_ids), naive_s)\nrun_tests('5.6')"),
    )
    first, found = first_code_cell(nb), sections(nb)[1]
    problems = undefined_names(first, found[1], "nb")
    assert sorted(p.split(" (")[0] for p in problems) == [
        "code cell 1 of the section reads 'model'",
        "code cell 2 of the section reads 'naive_s'",
        "code cell 2 of the section reads 'text_ids'",
    ]
    assert found[1].is_exercise and not found[0].is_exercise


def test_check_accepts_a_section_with_its_own_setup():
    nb = _notebook(
        ("code", "from llmrs_core.workbook import exercises, run_tests"),
        ("markdown", "## 7.6 Try It Yourself"),
        ("code", "import llmrs_core as llmrs\nmodel = llmrs.load()\nex = exercises(7)"),
        ("code", "def serve(xs):\n    return [model.generate(x) for x in xs]\nprint(serve(['a']))"),
        ("code", "for i, x in enumerate(range(3)):\n    print(i, x, len([y for y in range(x)]))"),
    )
    assert undefined_names(first_code_cell(nb), sections(nb)[1][0], "nb") == []


def test_check_refuses_cells_that_are_not_python():
    nb = _notebook(("code", "import numpy"), ("markdown", "## 1.6 Try It"), ("code", "%timeit ex.f()"))
    with pytest.raises(AssertionError, match="not plain Python"):
        undefined_names(first_code_cell(nb), sections(nb)[1][0], "nb")


@pytest.mark.parametrize(("impl", "labelled"), [("solutions", True), ("learner", False)])
def test_run_tests_labels_the_reference_run(impl, labelled, monkeypatch, capsys):
    # the report's wording, without running pytest: the subprocess answers as a passing run would
    done = workbook.subprocess.CompletedProcess([], 0, stdout="...\n3 passed, 7 deselected in 1.00s\n", stderr="")
    monkeypatch.setattr(workbook.subprocess, "run", lambda *a, **k: done)
    assert workbook.run_tests("3.6", impl=impl)
    first, *_ = capsys.readouterr().out.splitlines()
    assert (first == REFERENCE_RUN) is labelled
    assert labelled or first == "Exercise 3.6 (learner): all tests pass — 3 passed, 7 deselected in 1.00s"


@pytest.mark.parametrize(("report", "counts"), [
    ("Exercise 12.6 (solutions): all tests pass — 23 passed, 2 skipped, 25 deselected in 5.06s", (25, 25)),
    ("Exercise 1.6 (solutions): all tests pass — 23 passed in 7.97s", (23, 0)),
    ("= 1 failed, 3 passed, 2 errors, 1 xfailed, 4 deselected in 2.00s =", (7, 4)),
    ("Exercise 3.6 (learner): not there yet.", None),
])
def test_stored_counts_are_read_as_pytest_writes_them(report, counts):
    assert counts_in(report) == counts


def test_tests_are_counted_per_exercise_in_their_chapter_folder():
    ids = [
        "tests/ch05/test_kv_cache.py::test_ex5_6_view_shape[2-8]",
        "tests/ch05/test_kv_cache.py::test_ex5_6_view_shape[4-8]",
        "tests/ch05/test_paged.py::Test::test_ex5_7_blocks",
        "tests/ch05/test_paged.py::test_helper_is_not_an_exercise_test",
        "tests/ch06/test_q.py::test_ex5_6_in_another_chapter",   # run_tests("5.6") runs tests/ch05 only
        "tests/core/test_x.py::test_ex5_6_core",
    ]
    assert exercise_test_counts(ids) == Counter(
        {(5, None): 4, (5, "5.6"): 2, (5, "5.7"): 1, (6, None): 1, (6, "5.6"): 1})
