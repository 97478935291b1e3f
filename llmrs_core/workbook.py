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

import importlib
import importlib.util
import os
import subprocess
import sys
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
EXTRA_FOLDERS = ("appendix_a_benchmarking", "conclusion")


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


def run_tests(exercise: str, impl: str | None = None, verbose: bool = False) -> bool:
    """Run one exercise's tests (e.g. ``"1.6"``) in a subprocess and print a short report.

    Returns True when every test passed. Used from notebook cells; the same
    as ``make test-exercise E=1.6``.
    """
    impl = impl or current_impl()
    chapter, _, part = exercise.partition(".")
    if not (chapter.isdigit() and part.isdigit()):
        raise ValueError(f"exercise numbers look like '1.6', got {exercise!r}")
    root = find_root()
    test_dir = root / "tests" / f"ch{int(chapter):02d}"
    cmd = [
        sys.executable, "-m", "pytest", str(test_dir), "-k", f"ex{chapter}_{part}_",
        "--impl", impl, "--no-header", "-q" if not verbose else "-v", "--tb=short",
        "--color=no", "-p", "no:cacheprovider",
    ]
    env = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", **os.environ}
    proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True, env=env)
    out = proc.stdout.strip().splitlines()
    summary = out[-1] if out else proc.stderr.strip()
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
