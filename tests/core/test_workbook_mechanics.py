"""The exercise mechanics end to end: a throwaway workbook run through pytest and make in a subprocess.

Checks what a learner sees on fresh stubs (every stub listed, grouped by
exercise, the marks explained, the workbook's own last line, a non-zero
exit), that solutions pass with a success message and the next step, that
an unknown exercise is named as such, that the stub check catches a test
that cannot fail and a stub that fails the wrong way, and ``make progress``
and ``make reset``. Nothing here touches the real ``chapters/``.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from llmrs_core.workbook import find_stubs

REPO = Path(__file__).resolve().parents[2]
CONFTEST = REPO / "tests" / "conftest.py"

STUBS = '''
"""Chapter 1, in miniature.

Exercise 1.6  Adding       (ch01_transformer.ipynb, section 1.6)
Exercise 1.7  Multiplying  (ch01_transformer.ipynb, section 1.7)
"""

__all__ = ["Counter", "add", "div", "mul"]


def add(a, b):
    raise NotImplementedError("Exercise 1.6 `add`: not implemented yet — see ch01_transformer.ipynb §1.6")


class Counter:
    def __init__(self):
        raise NotImplementedError(
            "Exercise 1.6 `Counter.__init__`: not implemented yet — see ch01_transformer.ipynb §1.6"
        )

    def bump(self):
        raise NotImplementedError("Exercise 1.7 `Counter.bump`: not implemented yet — see ch01_transformer.ipynb §1.7")


def mul(a, b):
    raise NotImplementedError("Exercise 1.7 `mul`: not implemented yet — see ch01_transformer.ipynb §1.7")


def div(a, b):
    raise NotImplementedError("Exercise 1.7 `div`: not implemented yet — see ch01_transformer.ipynb §1.7")
'''
SOLUTIONS = '''
__all__ = ["Counter", "add", "div", "mul"]


def add(a, b):
    return a + b


class Counter:
    def __init__(self):
        self.n = 0

    def bump(self):
        self.n += 1


def mul(a, b):
    return a * b


def div(a, b):
    return a / b
'''
TESTS = '''
def test_ex1_6_add(ex):
    assert ex.add(1, 2) == 3

def test_ex1_6_add_negative(ex):
    assert ex.add(-1, -2) == -3

def test_ex1_7_mul(ex):
    assert ex.mul(2, 3) == 6
'''
BAD_TESTS = '''
def test_ex1_6_cannot_fail(ex):
    assert ex is not None

def test_ex1_7_wrong_error(ex):
    ex.no_such_function()
'''
LEARNER_ADD = "def add(a, b):\n    return a + b  # the learner's\n"
STUB_ADD = (
    'def add(a, b):\n    raise NotImplementedError("Exercise 1.6 `add`: not implemented yet — '
    'see ch01_transformer.ipynb §1.6")\n'
)

STUB_COUNTER_INIT = textwrap.dedent(STUBS)[textwrap.dedent(STUBS).index("    def __init__") : textwrap.dedent(STUBS).index("    def bump")]


def git(root: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-c", "user.email=test@example.org", "-c", "user.name=test", *args],
        cwd=root, capture_output=True, text=True, check=True, timeout=30,
    ).stdout


@pytest.fixture
def workbook(tmp_path):
    (tmp_path / "chapters" / "ch01_transformer").mkdir(parents=True)
    (tmp_path / "chapters" / "ch01_transformer" / "exercises.py").write_text(textwrap.dedent(STUBS))
    (tmp_path / "solutions").mkdir()
    (tmp_path / "solutions" / "__init__.py").write_text("")
    (tmp_path / "solutions" / "ch01_transformer.py").write_text(textwrap.dedent(SOLUTIONS))
    (tmp_path / "tests" / "ch01").mkdir(parents=True)
    shutil.copy(CONFTEST, tmp_path / "tests" / "conftest.py")
    (tmp_path / "tests" / "ch01" / "test_fake.py").write_text(textwrap.dedent(TESTS))
    return tmp_path


@pytest.fixture
def committed(workbook):
    """The workbook as a git checkout whose HEAD holds the stubs (as a learner's clone does)."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    git(workbook, "init", "-q")
    git(workbook, "add", ".")
    git(workbook, "commit", "-q", "-m", "stubs")
    return workbook


def exercises_file(root: Path) -> Path:
    return root / "chapters" / "ch01_transformer" / "exercises.py"


def implement(root: Path, old: str, new: str) -> None:
    path = exercises_file(root)
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))


def run(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "tests", "-q", "--no-header", "-p", "no:cacheprovider", "-p", "no:nbval",
         *args],
        cwd=root, capture_output=True, text=True, timeout=120,
    )


def make(root: Path, *args: str) -> subprocess.CompletedProcess:
    """The real Makefile run in the throwaway workbook, with this checkout's environment as is."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    venv = Path(sys.executable).parent.parent
    return subprocess.run(
        ["make", "--no-print-directory", "-f", str(REPO / "Makefile"), f"VENV={venv}",
         "-o", str(venv / ".llmrs-setup.stamp"), *args],
        cwd=root, capture_output=True, text=True, timeout=120,
    )


def last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


# -- make test-chapter on fresh stubs ---------------------------------------------


def test_fresh_stubs_list_every_stub_grouped_by_exercise(workbook):
    proc = run(workbook, "--impl", "learner")
    out = proc.stdout
    assert proc.returncode == 1, "unimplemented exercises must fail the run"
    assert "Traceback" not in out and "FAILURES" not in out, out
    assert "3 not implemented" in out, out
    report = out[out.index("not implemented yet: 5 functions") :]
    # every stub, also those no test reaches (Counter, div), under its exercise, with file:line
    assert report.index("Exercise 1.6  Adding") < report.index("    add ") < report.index("    Counter.__init__ ")
    assert report.index("Exercise 1.7  Multiplying") < report.index("    Counter.bump ") < report.index("    div ")
    assert report.index("Exercise 1.6") < report.index("Exercise 1.7")
    assert "chapters/ch01_transformer/exercises.py:11" in report, "add's line"


def test_fresh_stubs_explain_the_marks_and_end_with_the_workbooks_line(workbook):
    out = run(workbook, "--impl", "learner").stdout
    assert "N not implemented yet" in out, "the N marks must be explained"
    line = last_line(out)
    assert line.startswith("Chapter 1: Exercise 1.6 not started, 2 functions left to write; Exercise 1.7"), out
    assert "start with `add` (chapters/ch01_transformer/exercises.py:11)" in line
    assert "make test-chapter 1" in line


def test_make_test_chapter_ends_on_our_line_with_a_failing_status(workbook):
    proc = make(workbook, "test-chapter", "1")
    assert proc.returncode != 0, "stubs must still fail the command"
    assert "Error 1" not in proc.stdout + proc.stderr, proc.stderr
    assert last_line(proc.stdout).startswith("Chapter 1: Exercise 1.6 not started")
    assert not proc.stderr.strip(), proc.stderr


def test_a_partial_exercise_is_in_progress_and_lists_what_is_left(workbook):
    implement(workbook, STUB_ADD, LEARNER_ADD)
    out = run(workbook, "--impl", "learner").stdout
    line = last_line(out)
    # no test fails: "in progress", never "failing" (issue 32)
    assert "Exercise 1.6 in progress: 2 of 2 tests pass, 1 function left to write" in line, out
    assert "start with `Counter.__init__`" in line


def test_a_wrong_implementation_points_at_the_failures(workbook):
    implement(workbook, STUB_ADD, "def add(a, b):\n    return a - b\n")
    proc = run(workbook, "--impl", "learner", "--exercise", "1.6")
    assert proc.returncode == 1
    assert "Exercise 1.6 failing: 0 of 2 tests pass" in last_line(proc.stdout)
    assert "fix the failures above, then run `make test-exercise E=1.6` again" in last_line(proc.stdout)


# -- success, next steps, unknown exercises -----------------------------------------


def test_a_green_exercise_says_so_and_names_the_next_one(workbook):
    implement(workbook, STUB_ADD, LEARNER_ADD)
    implement(workbook, STUB_COUNTER_INIT, "    def __init__(self):\n        self.n = 0\n")
    proc = run(workbook, "--impl", "learner", "--exercise", "1.6")
    assert proc.returncode == 0, proc.stdout
    assert "2 passed, 1 deselected" in proc.stdout
    assert last_line(proc.stdout) == "Exercise 1.6 passes. Next: Exercise 1.7, `make test-exercise E=1.7`."


def test_a_green_chapter_names_the_next_chapter(workbook):
    shutil.copy(workbook / "solutions" / "ch01_transformer.py", exercises_file(workbook))
    (workbook / "tests" / "ch03").mkdir()
    (workbook / "tests" / "ch03" / "test_fake.py").write_text("def test_ex3_6_x(ex):\n    ex.f()\n")
    proc = make(workbook, "test-chapter", "1")
    assert proc.returncode == 0, proc.stdout
    assert last_line(proc.stdout) == "Chapter 1 (Exercises 1.6 and 1.7) passes. Next: chapter 3, `make test-chapter 3`."
    (workbook / "tests" / "ch03" / "test_fake.py").unlink()
    assert last_line(run(workbook).stdout).endswith("That was the last chapter with exercises: `make progress` shows them all.")


def test_solutions_pass(workbook):
    proc = run(workbook, "--impl", "solutions")
    assert proc.returncode == 0, proc.stdout
    assert "3 passed" in proc.stdout
    assert last_line(proc.stdout) == "The reference solutions pass Chapter 1 (Exercises 1.6 and 1.7)."


def test_env_variable_selects_the_implementation(workbook, monkeypatch):
    monkeypatch.setenv("LLMRS_IMPL", "solutions")
    assert run(workbook).returncode == 0


def test_an_unknown_exercise_lists_the_chapters_exercises(workbook):
    proc = make(workbook, "test-exercise", "E=1.8")
    assert proc.returncode != 0
    assert "there is no Exercise 1.8: chapter 1 has exercises 1.6 and 1.7" in proc.stderr, proc.stderr
    assert "deselected" not in proc.stdout and "Error" not in proc.stderr.replace("ERROR:", "")


def test_a_chapter_without_exercises_says_so(workbook):
    proc = run(workbook, "--exercise", "2.4")
    assert proc.returncode == 4
    assert "there is no Exercise 2.4: chapter 2 has no exercises yet" in proc.stderr


# -- the stub check (make check-stubs) -------------------------------------------------


def test_stub_check_accepts_proper_stubs(workbook):
    proc = run(workbook, "--expect-stubs")
    assert proc.returncode == 0, proc.stdout
    assert "3 passed" in proc.stdout
    assert "not implemented yet" not in proc.stdout, "the learner's report is not for the stub check"


def test_stub_check_catches_tests_that_cannot_fail(workbook):
    (workbook / "tests" / "ch01" / "test_bad.py").write_text(textwrap.dedent(BAD_TESTS))
    proc = run(workbook, "--expect-stubs")
    assert proc.returncode == 1
    assert "PASSED on the untouched stub" in proc.stdout
    assert "expected the stub's NotImplementedError" in proc.stdout
    assert "2 failed, 3 passed" in proc.stdout


# -- stubs are found in the file ---------------------------------------------------------


def test_find_stubs_reads_functions_and_methods_and_ignores_dead_raises():
    stubs = find_stubs(textwrap.dedent(STUBS))
    assert [(s.exercise, s.qualname) for s in stubs] == [
        ("1.6", "add"), ("1.6", "Counter.__init__"), ("1.7", "Counter.bump"), ("1.7", "mul"), ("1.7", "div"),
    ]
    done = textwrap.dedent(STUBS).replace(
        STUB_ADD, 'def add(a, b):\n    return a + b\n    raise NotImplementedError("Exercise 1.6 `add`: x")\n'
    )
    assert "add" not in [s.qualname for s in find_stubs(done)], "a raise after a return is not reached"


# -- make progress -------------------------------------------------------------------------


def progress(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "llmrs_core.workbook.progress"], cwd=root, capture_output=True, text=True,
        timeout=120,
    )


def row(out: str, exercise: str) -> str:
    return next(line for line in out.splitlines() if line.startswith(exercise + " "))


def test_progress_on_fresh_stubs_runs_no_tests(committed):
    proc = progress(committed)
    assert proc.returncode == 0, proc.stderr
    assert "not started" in row(proc.stdout, "1.6") and "not started" in row(proc.stdout, "1.7")
    assert "the tests of 0 exercises ran" in proc.stdout
    assert "0 of 2 exercises pass" in proc.stdout


def test_progress_tells_passing_failing_and_not_started_apart(committed):
    implement(committed, STUB_ADD, LEARNER_ADD)  # 1.6: add works, Counter is still a stub
    out = progress(committed).stdout
    assert "in progress: 2 of 2 tests pass, 1 function left to write" in row(out, "1.6"), out
    assert "not started" in row(out, "1.7")
    assert "the tests of 1 exercise ran" in out
    shutil.copy(committed / "solutions" / "ch01_transformer.py", exercises_file(committed))
    out = progress(committed).stdout
    assert "passing: all 2 tests pass" in row(out, "1.6") and "passing: all 1 tests pass" in row(out, "1.7")
    assert "2 of 2 exercises pass" in out


# -- make reset ------------------------------------------------------------------------------


def test_reset_puts_back_one_exercise_and_keeps_the_rest(committed):
    shutil.copy(committed / "solutions" / "ch01_transformer.py", exercises_file(committed))
    implement(committed, "def div(a, b):", "def helper():\n    return 1\n\n\ndef div(a, b):")
    learners = exercises_file(committed).read_text()
    proc = make(committed, "reset", "E=1.6")
    assert proc.returncode == 0, proc.stderr
    backups = list(exercises_file(committed).parent.glob("exercises.py.1.6-*.bak"))
    assert len(backups) == 1 and backups[0].read_text() == learners, "the learner's whole file is backed up"
    assert backups[0].name in proc.stdout, "the backup is named"
    stubs = find_stubs(exercises_file(committed).read_text())
    assert [(s.exercise, s.qualname) for s in stubs] == [("1.6", "add"), ("1.6", "Counter.__init__")]
    text = exercises_file(committed).read_text()
    assert "self.n += 1" in text, "Counter.bump (Exercise 1.7) keeps the learner's code"
    assert "def helper():" in text and "return a / b" in text


def test_reset_refuses_an_unknown_exercise(committed):
    before = exercises_file(committed).read_text()
    proc = make(committed, "reset", "E=1.8")
    assert proc.returncode != 0
    assert "there is no Exercise 1.8: chapter 1 has exercises 1.6 and 1.7; nothing was changed" in proc.stderr
    assert exercises_file(committed).read_text() == before
    assert not list(exercises_file(committed).parent.glob("*.bak"))


def test_run_tests_under_make_test_says_where_the_tests_run(monkeypatch, capsys):
    # make test's nbval step: the exercise's tests are test-solutions' to run; a notebook cell says so
    from llmrs_core import workbook

    def no_subprocess(*args, **kwargs):
        raise AssertionError("run_tests started pytest although LLMRS_RUN_TESTS=elsewhere")

    monkeypatch.setenv("LLMRS_RUN_TESTS", "elsewhere")
    monkeypatch.setattr(workbook.subprocess, "run", no_subprocess)
    assert workbook.run_tests("3.6", impl="solutions") is True
    out = capsys.readouterr().out
    assert out.startswith(workbook.REFERENCE_RUN) and "test-solutions step runs these tests" in out


def test_a_run_without_exercise_tests_says_so_instead_of_crashing(tmp_path):
    # pytest --collect-only runs nothing: the last line must not index an empty list
    from llmrs_core.workbook.report import final_line

    assert final_line(3, {}, "learner", tmp_path) == "Chapter 3: no exercise tests ran."


# -- issue 32: what the learner reads is true ------------------------------------------------


def test_a_passing_exercise_outside_the_engine_says_where_its_code_runs(workbook):
    from llmrs_core.workbook.report import final_line, results_for

    results = {e: r for e, r in results_for(1, [("1.6", "passed")], [], workbook).items() if e == "1.6"}
    line = final_line(1, results, "learner", workbook, {"3.6": ["attention"]})
    assert line.startswith("Exercise 1.6 passes: it is not part of the engine, so your code runs where the notebook "
                           "calls it: the cells of section 1.6 in ch01_transformer.ipynb. Next: Exercise 1.7"), line
    line = final_line(1, results, "learner", workbook, {"1.6": ["add"]})
    assert "your add now runs inside the engine" in line and "not part of the engine" not in line, line
    line = final_line(1, results, "learner", workbook, {})  # the learner backend did not start: say nothing of it
    assert line == "Exercise 1.6 passes. Next: Exercise 1.7, `make test-exercise E=1.7`.", line


def test_progress_keeps_titles_whole_and_explains_the_engine_column(committed):
    from llmrs_core.workbook.progress import ENGINE_LEGEND, NOT_IN_ENGINE, Row, _engine_column, format_table
    from llmrs_core.workbook.report import ExerciseResult

    title = "Building a Multi-GPU Engine (here: multi-process)"
    table = format_table([Row(11, ExerciseResult("11.5", title), "not started", NOT_IN_ENGINE)])
    assert title in table, table
    assert _engine_column("11.5", {"3.6": []}) == NOT_IN_ENGINE and NOT_IN_ENGINE in ENGINE_LEGEND
    assert _engine_column("3.6", {"3.6": []}).startswith("reference") and "reference =" in ENGINE_LEGEND
    assert "YOURS =" in ENGINE_LEGEND
    out = progress(committed).stdout
    assert ENGINE_LEGEND in out, out


def test_reset_of_an_untouched_exercise_makes_no_backup(committed):
    implement(committed, STUB_ADD, LEARNER_ADD)  # 1.6 begun; 1.7 still the stubs
    before = exercises_file(committed).read_text()
    proc = make(committed, "reset", "E=1.7")
    assert proc.returncode == 0, proc.stderr
    assert "Exercise 1.7 is still the stubs" in proc.stdout and "no backup made" in proc.stdout, proc.stdout
    assert not list(exercises_file(committed).parent.glob("*.bak")), "a copy of the stubs is no backup"
    assert exercises_file(committed).read_text() == before
    proc = make(committed, "reset", "E=1.6")  # the begun one is still backed up
    assert len(list(exercises_file(committed).parent.glob("exercises.py.1.6-*.bak"))) == 1, proc.stdout


REPEATED = '''
import numpy as np
import pytest


@pytest.mark.parametrize("n", [300, 400, 500, 600])
def test_ex1_6_add_arrays(ex, n):
    x = np.arange(n, dtype=np.float64)
    assert np.all(ex.add(x, x) == 2 * x), f"add of {n} values must add them elementwise"
'''


def test_one_mistake_is_diagnosed_once_and_its_repeats_take_a_line_each(workbook):
    (workbook / "tests" / "ch01" / "test_repeated.py").write_text(textwrap.dedent(REPEATED))
    implement(workbook, STUB_ADD, "def add(a, b):\n    return a - b\n")
    out = run(workbook, "--impl", "learner", "--tb=short", "--exercise", "1.6").stdout
    # the message is the diagnosis: pytest's introspection of whole arrays below it is left out (a bare assert,
    # as test_ex1_6_add's, keeps its explanation: it has nothing else)
    assert "where np.False_" not in out and "array([" not in out, out
    # pytest's own one-line summary repeats each message, cut to the terminal's width: count above it
    failures = out.split("short test summary info")[0]
    assert failures.count("add of 300 values must add them elementwise") == 1, out
    repeats = [line for line in failures.splitlines() if "the same diagnosis as test_ex1_6_add_arrays[300]" in line]
    assert len(repeats) == 3, out
    assert repeats[0].startswith("AssertionError: add of 400 values must add them elementwise"), repeats
    solutions = run(workbook, "--impl", "solutions", "--tb=short")
    assert solutions.returncode == 0, "the reference passes these tests"
