"""Workbook plumbing: where the chapters are, and which implementation to run.

Not engine code: this is how notebooks and tests reach the learner's
``chapters/chNN_*/exercises.py`` or the reference ``solutions/chNN_*.py``.
The choice follows ``LLMRS_IMPL`` (``learner``, the default, or
``solutions``), so CI can run every notebook cell on the solutions while a
learner runs them on their own code::

    from llmrs_core.workbook import exercises, run_tests
    ex = exercises(1)          # the learner's module, or the solutions
    run_tests("1.6")           # run Exercise 1.6's tests, print a summary
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

IMPLS = ("learner", "solutions")

# chapter number -> folder under chapters/ (and module name under solutions/)
CHAPTERS: dict[int, str] = {
    0: "ch00_introduction",
    1: "ch01_transformer",
    2: "ch02_tokenization",
    3: "ch03_attention",
    4: "ch04_inference_loop",
    5: "ch05_kv_cache",
    6: "ch06_quantization",
    7: "ch07_batching",
    8: "ch08_cpu_optimization",
    9: "ch09_gpu",
    10: "ch10_model_formats",
    11: "ch11_distributed_serving",
    12: "ch12_production",
}
# folders without a chapter number (no exercises)
EXTRA_FOLDERS = ("appendix_a_benchmarking", "appendix_b_model_families", "conclusion")


def find_root(start: Path | None = None) -> Path:
    """The workbook checkout: the nearest folder holding ``chapters/`` and ``solutions/``.

    Searched upwards from ``start`` (default: the working directory), then
    from this file's location (an editable install lives in the checkout).
    """
    candidates = [Path(start or Path.cwd()).resolve(), Path(__file__).resolve()]
    for origin in candidates:
        for folder in (origin, *origin.parents):
            if (folder / "chapters").is_dir() and (folder / "solutions").is_dir():
                return folder
    raise FileNotFoundError(
        "cannot find the workbook checkout (a folder with chapters/ and solutions/); "
        "run from inside the repository"
    )


def current_impl() -> str:
    """``LLMRS_IMPL`` if set (``learner`` or ``solutions``), else ``learner``."""
    impl = os.environ.get("LLMRS_IMPL", "learner").strip() or "learner"
    if impl not in IMPLS:
        raise ValueError(f"LLMRS_IMPL={impl!r}; use one of {', '.join(IMPLS)}")
    return impl


def chapter_folder(chapter: int) -> str:
    try:
        return CHAPTERS[chapter]
    except KeyError:
        raise ValueError(f"there is no chapter {chapter}; chapters are 0..{max(CHAPTERS)}") from None


def exercises_path(chapter: int, root: Path | None = None) -> Path:
    """Path of the learner's ``exercises.py`` for ``chapter``."""
    root = root or find_root()
    return root / "chapters" / chapter_folder(chapter) / "exercises.py"


def committed_source(path: Path, root: Path | None = None, rev: str = "HEAD") -> str:
    """The text of ``path`` as git has it at ``rev`` (``git show REV:path``): the untouched stubs,
    for an ``exercises.py`` the learner has not committed. ``LookupError`` saying why if git
    cannot tell (no git, not a checkout, no such revision or file)."""
    root = root or find_root()
    relative = Path(path).resolve().relative_to(root.resolve()).as_posix()
    try:
        proc = subprocess.run(
            ["git", "show", f"{rev}:{relative}"], cwd=root, capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise LookupError(f"git could not be run ({e})") from None
    if proc.returncode != 0:
        raise LookupError(f"git has no {relative} at {rev}: {proc.stderr.strip() or 'git show failed'}")
    return proc.stdout


def exercises(chapter: int, impl: str | None = None, root: Path | None = None) -> ModuleType:
    """The module under test for ``chapter``: the learner's exercises or the solutions.

    The learner's file is loaded afresh on every call, so a notebook picks
    up edits without restarting the kernel.
    """
    impl = impl or current_impl()
    if impl not in IMPLS:
        raise ValueError(f"impl={impl!r}; use one of {', '.join(IMPLS)}")
    root = root or find_root()
    folder = chapter_folder(chapter)
    if impl == "solutions":
        if str(root) not in sys.path:
            sys.path.insert(0, str(root))
        return importlib.import_module(f"solutions.{folder}")
    path = exercises_path(chapter, root)
    if not path.exists():
        raise FileNotFoundError(f"chapter {chapter} has no exercises ({path} does not exist)")
    name = f"llmrs_exercises_ch{chapter:02d}"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look modules up by name
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


# -- the exercises of a chapter, found in its files ------------------------------

#: the pointed message every stub raises: ``Exercise 3.6 `softmax`: not implemented yet — see ...``
STUB_MESSAGE = re.compile(r"^Exercise (?P<exercise>\d+\.\d+) `(?P<qualname>[\w.]+)`: not implemented yet")
#: a line of an exercises module's docstring: ``Exercise 3.6  Implementing ...  (ch03_attention.ipynb, ...``
_TITLE_LINE = re.compile(r"^Exercise (?P<exercise>\d+\.\d+)\s+(?P<title>.+?)\s+\((?P<notebook>[\w.]+\.ipynb)")
#: a test of exercise N.M is named ``test_exN_M_...``
TEST_NAME = re.compile(r"^test_ex(?P<n>\d+)_(?P<m>\d+)_")


@dataclass(frozen=True)
class Stub:
    """A function or method of ``exercises.py`` that still raises its exercise's NotImplementedError."""

    exercise: str  # "3.6"
    qualname: str  # "softmax", "ContiguousKVCache.write"
    line: int  # where its ``def`` is (1-based)
    message: str  # the pointed message it raises


def exercise_key(exercise: str) -> tuple[int, int]:
    """``"3.10"`` -> ``(3, 10)``: exercise numbers in numeric order."""
    n, _, m = exercise.partition(".")
    return int(n), int(m)


def _pointed_raise(node: ast.AST) -> str | None:
    """The message of ``raise NotImplementedError("Exercise N.M `name`: ...")``, else None."""
    if not (isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call)):
        return None
    call = node.exc
    if getattr(call.func, "id", None) != "NotImplementedError" or not call.args:
        return None
    arg = call.args[0]
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and STUB_MESSAGE.match(arg.value):
        return arg.value
    return None


def _still_raises(func: ast.FunctionDef | ast.AsyncFunctionDef) -> str | None:
    """The stub message a call of ``func`` can still reach: a pointed raise in its body that
    comes before any top-level ``return`` (code the learner wrote above a forgotten raise
    returns before it, so that function is not a stub any more)."""
    for statement in func.body:
        if isinstance(statement, ast.Return):
            return None
        for node in ast.walk(statement):
            if (message := _pointed_raise(node)) is not None:
                return message
    return None


def public_names(tree: ast.Module) -> set[str] | None:
    """The names in a module's ``__all__`` (a literal list or tuple), None without one."""
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            if isinstance(node.value, (ast.List, ast.Tuple)):
                return {e.value for e in node.value.elts if isinstance(e, ast.Constant)}
    return None


def find_stubs(source: str) -> list[Stub]:
    """Every stub left in the source of an ``exercises.py``, in file order.

    Found structurally: each public function, and each method of a public class,
    whose body still raises the pointed ``NotImplementedError`` — whether or not
    a test reached it. Public means listed in ``__all__`` (or not starting with
    ``_`` where there is no ``__all__``). Raises ``SyntaxError`` for a file that
    does not parse.
    """
    tree = ast.parse(source)
    listed = public_names(tree)
    stubs: list[Stub] = []

    def is_public(name: str) -> bool:
        return name in listed if listed is not None else not name.startswith("_")

    def visit(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef) and (prefix or is_public(node.name)):
                visit(node.body, f"{prefix}{node.name}.")
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and (prefix or is_public(node.name)):
                message = _still_raises(node)
                if message is not None:
                    m = STUB_MESSAGE.match(message)
                    stubs.append(Stub(m["exercise"], prefix + node.name, node.lineno, message))

    visit(tree.body, "")
    return stubs


def exercise_titles(source: str) -> dict[str, str]:
    """``{"3.6": "Implementing Scaled Dot-Product Attention", ...}`` from the module docstring."""
    try:
        doc = ast.get_docstring(ast.parse(source)) or ""
    except SyntaxError:  # the learner's file may not parse; the docstring is its first lines
        doc = source[:4000]
    titles = {}
    for line in doc.splitlines():
        if m := _TITLE_LINE.match(line.strip()):
            titles[m["exercise"]] = m["title"]
    return titles


def tests_folder(chapter: int, root: Path | None = None) -> Path:
    """``tests/chNN``: the chapter's exercise tests."""
    return (root or find_root()) / "tests" / f"ch{chapter:02d}"


def tested_exercises(chapter: int, root: Path | None = None) -> set[str]:
    """The exercise numbers that ``tests/chNN/test_*.py`` hold tests for (``def test_exN_M_...``)."""
    found = set()
    for path in sorted(tests_folder(chapter, root).glob("test_*.py")):
        for m in re.finditer(r"^\s*(?:async\s+)?def (test_ex\d+_\d+_)", path.read_text(), re.MULTILINE):
            t = TEST_NAME.match(m.group(1))
            found.add(f"{t['n']}.{t['m']}")
    return found


def chapter_exercises(chapter: int, root: Path | None = None) -> dict[str, str]:
    """``{"3.6": title, "3.7": title}``: the chapter's exercises in order, from its
    ``exercises.py`` (docstring and stubs) and from its tests; ``{}`` for a chapter without any."""
    path = exercises_path(chapter, root)
    titles: dict[str, str] = {}
    if path.exists():
        source = path.read_text()
        titles = exercise_titles(source)
        try:
            titles |= {s.exercise: titles.get(s.exercise, "") for s in find_stubs(source)}
        except SyntaxError:
            pass
    titles |= {e: titles.get(e, "") for e in tested_exercises(chapter, root)}
    return {e: titles[e] for e in sorted(titles, key=exercise_key) if exercise_key(e)[0] == chapter}


def say_exercises(chapter: int, exercises_: list[str] | dict[str, str]) -> str:
    """``"chapter 3 has exercises 3.6 and 3.7"`` (or ``"chapter 9 has no exercises yet"``)."""
    names = list(exercises_)
    if not names:
        return f"chapter {chapter} has no exercises yet"
    if len(names) == 1:
        return f"chapter {chapter} has exercise {names[0]}"
    return f"chapter {chapter} has exercises {', '.join(names[:-1])} and {names[-1]}"


def parse_exercise(exercise: str) -> tuple[int, str]:
    """``"3.6"`` -> ``(3, "3.6")``; a clear ``ValueError`` for anything else."""
    chapter, _, part = str(exercise).strip().partition(".")
    if not (chapter.isdigit() and part.isdigit()):
        raise ValueError(f"exercise numbers look like '3.6', got {exercise!r}")
    return int(chapter), f"{int(chapter)}.{int(part)}"


#: the first line of a ``run_tests`` report on the solutions: the notebooks' stored outputs come
#: from such runs (CI runs them with ``LLMRS_IMPL=solutions``), and must not read as the learner's
REFERENCE_RUN = (
    "Reference run (LLMRS_IMPL=solutions): the reference solutions' results, not yours. "
    "On your exercises.py this cell shows what is not implemented yet, or what fails."
)


def run_tests(exercise: str, impl: str | None = None, verbose: bool = False) -> bool:
    """Run one exercise's tests (e.g. ``"1.6"``) in a subprocess and print a short report.

    Returns True when every test passed. Used from notebook cells; the same
    as ``make test-exercise E=1.6``. On the solutions the report's first line
    is ``REFERENCE_RUN``, so that a stored output is not taken for the learner's.

    ``LLMRS_RUN_TESTS=elsewhere`` (set by ``make nbval`` inside ``make test``, whose
    ``test-solutions`` step runs every exercise's tests on the solutions anyway) prints
    that instead of running them a second time, and returns True.
    """
    impl = impl or current_impl()
    chapter, exercise = parse_exercise(exercise)
    if os.environ.get("LLMRS_RUN_TESTS") == "elsewhere":
        if impl == "solutions":
            print(REFERENCE_RUN)
        print(f"Exercise {exercise} ({impl}): not run here (LLMRS_RUN_TESTS=elsewhere): "
              "make test's test-solutions step runs these tests")
        return True
    root = find_root()
    cmd = [
        sys.executable, "-m", "pytest", str(tests_folder(chapter, root)), "--exercise", exercise,
        "--impl", impl, "--no-header", "-q" if not verbose else "-v", "--tb=short",
        "--color=no", "-p", "no:cacheprovider", "-p", "no:nbval",  # no notebooks here: start sooner
    ]
    env = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", **os.environ}
    proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True, env=env)
    out = proc.stdout.strip().splitlines()
    # pytest's own count ("10 passed, 7 deselected in 1.78s"); the workbook's next-step line follows it
    stats = [line for line in out if re.search(r"\b(passed|failed|error|not implemented)\b.* in [\d.]+s", line)]
    summary = stats[-1] if stats else (out[-1] if out else proc.stderr.strip())
    if impl == "solutions":
        print(REFERENCE_RUN)
    print(f"Exercise {exercise} ({impl}): ", end="")
    if proc.returncode == 0:
        print(f"all tests pass — {summary.strip('= ')}")
        return True
    print("not there yet.")
    print("\n".join(out[-40:]))
    return False


def setup_plots(dpi: int = 90, figsize: tuple[float, float] = (7, 3.5)) -> None:
    """The notebooks' plot style, and figures stored as 256-colour PNGs (a third of the bytes).

    Call once at the top of a notebook, after importing matplotlib. Outside
    IPython it only sets the style.
    """
    import io

    import matplotlib.pyplot as plt

    plt.rcParams.update(
        {"figure.dpi": dpi, "figure.figsize": figsize, "axes.grid": True, "grid.alpha": 0.3,
         "font.size": 9, "axes.spines.top": False, "axes.spines.right": False}
    )
    try:
        from IPython import get_ipython
        from PIL import Image
    except ImportError:
        return
    shell = get_ipython()
    if shell is None:
        return
    shell.run_line_magic("matplotlib", "inline")

    def compact_png(fig) -> bytes:
        raw, out = io.BytesIO(), io.BytesIO()
        fig.savefig(raw, format="png", bbox_inches="tight")
        Image.open(raw).convert("RGB").quantize(256).save(out, format="png", optimize=True)
        return out.getvalue()

    shell.display_formatter.formatters["image/png"].for_type(plt.Figure, compact_png)
