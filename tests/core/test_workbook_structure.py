"""The workbook's shape: chapter folders, exercises vs solutions, stubs, set-up files."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from llmrs_core.workbook import CHAPTERS, EXTRA_FOLDERS, exercises

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
STUB = re.compile(
    r"^Exercise (?P<n>\d+)\.(?P<m>\d+) `(?P<qualname>[\w.]+)`: not implemented yet — "
    r"see (?P<notebook>\w+)\.ipynb §(?P<section>\d+\.\d+)$"
)


def chapters_with_exercises() -> list[int]:
    return [n for n, folder in CHAPTERS.items() if (ROOT / "chapters" / folder / "exercises.py").exists()]


def test_every_chapter_folder_has_a_readme():
    for folder in [*CHAPTERS.values(), *EXTRA_FOLDERS]:
        readme = ROOT / "chapters" / folder / "README.md"
        assert readme.exists(), f"chapters/{folder}/README.md is missing"
        assert readme.read_text().strip(), f"chapters/{folder}/README.md is empty"


def test_foundation_chapters_have_notebooks():
    for n in (0, 1):
        folder = CHAPTERS[n]
        assert (ROOT / "chapters" / folder / f"{folder}.ipynb").exists(), f"{folder}.ipynb is missing"


@pytest.mark.parametrize("chapter", chapters_with_exercises())
def test_chapter_is_complete(chapter):
    folder = CHAPTERS[chapter]
    assert (ROOT / "chapters" / folder / f"{folder}.ipynb").exists(), f"chapter {chapter} needs its notebook"
    assert (ROOT / "solutions" / f"{folder}.py").exists(), f"solutions/{folder}.py is missing"
    tests = list((ROOT / "tests" / f"ch{chapter:02d}").glob("test_*.py"))
    assert tests, f"chapter {chapter} has exercises but no tests in tests/ch{chapter:02d}/"
    for test_file in tests:
        for node in ast.parse(test_file.read_text()).body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                assert re.match(rf"test_ex{chapter}_\d+_", node.name), (
                    f"{test_file.name}::{node.name} should be named test_ex{chapter}_M_..."
                )


# -- exercises and solutions expose the same API --------------------------------


def describe(obj) -> object:
    """A comparable description of a public name: signatures, fields, members."""
    if inspect.isclass(obj):
        members = {}
        for name, value in vars(obj).items():
            if name.startswith("_") and name != "__init__":
                continue
            if isinstance(value, (classmethod, staticmethod)):
                members[name] = (type(value).__name__, str(inspect.signature(value.__func__)))
            elif isinstance(value, property):
                members[name] = ("property",)
            elif inspect.isfunction(value):
                members[name] = ("method", str(inspect.signature(value)))
            elif dataclasses.is_dataclass(obj) and name in {f.name for f in dataclasses.fields(obj)}:
                continue  # a field's default: compared with the fields
            else:
                members[name] = ("attribute", repr(value))
        fields = (
            [(f.name, str(f.type), repr(f.default)) for f in dataclasses.fields(obj)]
            if dataclasses.is_dataclass(obj)
            else None
        )
        bases = [b.__name__ for b in obj.__mro__[1:]]
        return {"class": obj.__name__, "bases": bases, "fields": fields, "members": members}
    if callable(obj):
        return ("function", str(inspect.signature(obj)))
    return ("value", type(obj).__name__)


@pytest.mark.parametrize("chapter", chapters_with_exercises())
def test_exercises_and_solutions_have_the_same_api(chapter):
    learner = exercises(chapter, "learner", root=ROOT)
    solutions = exercises(chapter, "solutions", root=ROOT)
    for module in (learner, solutions):
        assert hasattr(module, "__all__"), f"{module.__name__} must list its public names in __all__"
    assert sorted(learner.__all__) == sorted(solutions.__all__)
    for name in learner.__all__:
        ours, theirs = getattr(learner, name), getattr(solutions, name)
        if ours is theirs:
            continue
        assert describe(ours) == describe(theirs), f"chapter {chapter}: {name} differs between the two"


# -- every stub raises the pointed error -----------------------------------------


def stub_messages(path: Path) -> dict[str, str | None]:
    """qualname -> the NotImplementedError message its body raises (None if it raises none).

    Public functions and methods, and ``__init__``; a docstring starting with
    "(provided)" marks code given to the learner, which is skipped.
    """
    tree = ast.parse(path.read_text())
    out: dict[str, str | None] = {}

    def visit(body, prefix=""):
        for node in body:
            if isinstance(node, ast.ClassDef):
                visit(node.body, prefix + node.name + ".")
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and (
                not node.name.startswith("_") or node.name == "__init__"
            ):
                if (ast.get_docstring(node) or "").startswith("(provided)"):
                    continue  # given to the learner, not an exercise
                message = None
                for sub in ast.walk(node):
                    if (
                        isinstance(sub, ast.Raise)
                        and isinstance(sub.exc, ast.Call)
                        and getattr(sub.exc.func, "id", None) == "NotImplementedError"
                        and sub.exc.args
                        and isinstance(sub.exc.args[0], ast.Constant)
                    ):
                        message = sub.exc.args[0].value
                out[prefix + node.name] = message

    visit(tree.body)
    return out


@pytest.mark.parametrize("chapter", chapters_with_exercises())
def test_every_stub_raises_its_pointed_error(chapter):
    folder = CHAPTERS[chapter]
    path = ROOT / "chapters" / folder / "exercises.py"
    stubs = stub_messages(path)
    assert stubs, f"{path} has no exercise stubs"
    exercise_numbers = set()
    for qualname, message in stubs.items():
        assert message is not None, f"{qualname} in {path.name} must raise NotImplementedError('Exercise ...')"
        m = STUB.match(message)
        assert m, f"{qualname}: message {message!r} does not follow the 'Exercise N.M `name`: ...' pattern"
        assert int(m["n"]) == chapter, f"{qualname}: exercise number {m['n']}.{m['m']} is not chapter {chapter}"
        assert m["qualname"] == qualname, f"{qualname}: the message names {m['qualname']}"
        assert m["notebook"] == folder, f"{qualname}: the message points to {m['notebook']}.ipynb"
        assert m["section"] == f"{m['n']}.{m['m']}"
        exercise_numbers.add(f"{m['n']}_{m['m']}")
    test_names = " ".join(
        p.read_text() for p in (ROOT / "tests" / f"ch{chapter:02d}").glob("test_*.py")
    )
    for number in exercise_numbers:
        assert f"def test_ex{number}_" in test_names, f"Exercise {number.replace('_', '.')} has no tests"


# -- set-up files -------------------------------------------------------------------


def requirement_names(specs) -> set[str]:
    names = set()
    for spec in specs:
        name = re.split(r"[<>=!~;\[ ]", spec, maxsplit=1)[0].strip().lower().replace("_", "-")  # PEP 503
        if name and name not in {"python", "pip", "llmrs-core"}:
            names.add(name)
    return names


def test_environment_yml_matches_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    specs, todo = list(project["dependencies"]), ["lab", "dev"]
    while todo:  # the dev extra pulls in others by naming llmrs-core[lab], llmrs-core[serve]
        extra = todo.pop()
        for spec in extras[extra]:
            specs.append(spec)
            m = re.match(r"llmrs-core\[([a-z,]+)\]", spec)
            todo += m.group(1).split(",") if m else []
    wanted = requirement_names(specs)
    listed = []
    lines = (ROOT / "environment.yml").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("dependencies:"))
    for line in lines[start + 1 :]:
        m = re.match(r"^\s+- ([A-Za-z0-9_.\-]+[^#]*?)\s*(#.*)?$", line)
        if m and not m.group(1).endswith(":"):
            listed.append(m.group(1))
    assert requirement_names(listed) == wanted, (
        "environment.yml and pyproject.toml (dependencies + lab + dev, and the extras dev pulls in) list different packages"
    )


def test_gitignore_keeps_weights_and_environments_out():
    ignored = (ROOT / ".gitignore").read_text().split()
    for pattern in ("models/", "*.gguf", ".venv/", "__pycache__/"):
        assert pattern in ignored, f".gitignore should contain {pattern}"
    if shutil.which("git") and (ROOT / ".git").exists():
        tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True).stdout
        # tests/golden/ may hold tiny reference files (a 4 KB torch checkpoint); nothing else may
        weights = [f for f in tracked.splitlines()
                   if re.search(r"\.(gguf|safetensors|bin|whl)$", f) and not f.startswith("tests/golden/")]
        assert not weights, f"model weights are tracked: {weights}"
