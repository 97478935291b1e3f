"""The exercise mechanics end to end: a throwaway workbook run through pytest in a subprocess.

Checks what a learner sees on fresh stubs (one line per exercise, no
tracebacks, non-zero exit), that solutions pass, and that the stub check
catches a test that cannot fail and a stub that fails the wrong way.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

CONFTEST = Path(__file__).resolve().parents[1] / "conftest.py"

STUBS = '''
__all__ = ["add", "mul"]

def add(a, b):
    raise NotImplementedError("Exercise 1.6 `add`: not implemented yet — see ch01_transformer.ipynb §1.6")

def mul(a, b):
    raise NotImplementedError("Exercise 1.7 `mul`: not implemented yet — see ch01_transformer.ipynb §1.7")
'''
SOLUTIONS = '''
__all__ = ["add", "mul"]

def add(a, b):
    return a + b

def mul(a, b):
    return a * b
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


def run(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "tests", "-q", "--no-header", "-p", "no:cacheprovider", *args],
        cwd=root, capture_output=True, text=True, timeout=120,
    )


def test_fresh_stubs_give_one_line_per_exercise(workbook):
    proc = run(workbook, "--impl", "learner")
    out = proc.stdout
    assert proc.returncode == 1, "unimplemented exercises must fail the run"
    assert "Traceback" not in out and "FAILURES" not in out, out
    assert out.count("Exercise 1.6 `add`: not implemented yet") == 1, out
    assert out.count("Exercise 1.7 `mul`: not implemented yet") == 1, out
    assert "3 not implemented" in out, out
    assert "make test-chapter 1" in out


def test_solutions_pass(workbook):
    proc = run(workbook, "--impl", "solutions")
    assert proc.returncode == 0, proc.stdout
    assert "3 passed" in proc.stdout


def test_env_variable_selects_the_implementation(workbook, monkeypatch):
    monkeypatch.setenv("LLMRS_IMPL", "solutions")
    assert run(workbook).returncode == 0


def test_stub_check_accepts_proper_stubs(workbook):
    proc = run(workbook, "--expect-stubs")
    assert proc.returncode == 0, proc.stdout
    assert "3 passed" in proc.stdout


def test_stub_check_catches_tests_that_cannot_fail(workbook):
    (workbook / "tests" / "ch01" / "test_bad.py").write_text(textwrap.dedent(BAD_TESTS))
    proc = run(workbook, "--expect-stubs")
    assert proc.returncode == 1
    assert "PASSED on the untouched stub" in proc.stdout
    assert "expected the stub's NotImplementedError" in proc.stdout
    assert "2 failed, 3 passed" in proc.stdout
