"""``make progress``: every exercise of every chapter, with its status and whether the engine runs it.

The stubs left in each ``chapters/chNN_*/exercises.py`` are read from the file.
An exercise whose functions are all still the stubs git has (``HEAD``) is
*not started* without running anything; the tests of every other exercise
run in one quiet pytest process on the learner's code, and their outcomes
give *failing* or *passing* (see :mod:`llmrs_core.workbook.report`). So the
table costs the tests of the exercises actually begun, and nothing on a
fresh checkout. The engine column comes from the learner backend itself
(``--impl learner``): YOURS where it runs the learner's function, reference
where it stands in for it, ``notebook only`` where the exercise does not plug into
the engine (its code runs in the notebook's cells and the tests); :data:`ENGINE_LEGEND`
says so under the table.

Run it as ``python -m llmrs_core.workbook.progress``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

from . import (
    CHAPTERS,
    STUB_MESSAGE,
    TEST_NAME,
    Stub,
    chapter_exercises,
    committed_source,
    exercise_titles,
    exercises_path,
    find_root,
    find_stubs,
    tested_exercises,
    tests_folder,
)
from .report import NOT_STARTED, PASSING, ExerciseResult, engine_parts, results_for

NOT_IN_ENGINE = "notebook only"
NO_ENGINE = "? (the learner backend did not start)"
#: the line under the table that says what the engine column's words mean
ENGINE_LEGEND = (
    "engine column: YOURS = `--impl learner` runs your code inside the engine; reference = the engine's own "
    f"stands in until yours passes its check; {NOT_IN_ENGINE} = the exercise does not plug into the engine: "
    "your code runs where its notebook section calls it, and in its tests."
)


@dataclass
class Row:
    """One line of the table."""

    chapter: int
    result: ExerciseResult
    status: str  # ExerciseResult.describe(), or why it could not be checked
    engine: str


def _junit_outcomes(xml_path: Path) -> list[tuple[str, str]]:
    """``(exercise, outcome)`` per test case of a pytest JUnit XML report."""
    pairs = []
    for case in ET.parse(xml_path).getroot().iter("testcase"):
        m = TEST_NAME.match(case.get("name", ""))
        if not m:
            continue
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error"):
                message = child.get("message", "")
                not_implemented = STUB_MESSAGE.match(message) or STUB_MESSAGE.match(child.text or "")
                outcome = "not implemented" if not_implemented else "failed"
                break
            if child.tag == "skipped":
                outcome = "skipped"
        pairs.append((f"{int(m['n'])}.{int(m['m'])}", outcome))
    return pairs


def run_exercise_tests(root: Path, chapters: list[int], exercises: list[str]) -> tuple[list[tuple[str, str]], str]:
    """Run the tests of ``exercises`` (in ``chapters``' test folders) on the learner's code, quietly.

    Returns ``(exercise, outcome)`` per test and, when pytest could not run them, why.
    """
    if not exercises:
        return [], ""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "progress.xml"
        cmd = [
            sys.executable, "-m", "pytest", *(str(tests_folder(c, root)) for c in chapters),
            "-q", "--no-header", "-p", "no:cacheprovider", "-p", "no:nbval", "--impl", "learner", f"--junitxml={report}",
            *(a for e in exercises for a in ("--exercise", e)),
        ]
        env = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", **os.environ, "LLMRS_IMPL": "learner"}
        proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True, env=env)
        if not report.exists():
            return [], (proc.stderr.strip() or proc.stdout.strip() or f"pytest exited with {proc.returncode}")
        return _junit_outcomes(report), ""


def _engine_column(exercise: str, engine: dict[str, list[str]] | None) -> str:
    if engine is None:
        return NO_ENGINE
    if exercise not in engine:
        return NOT_IN_ENGINE
    mine = engine[exercise]
    return f"YOURS: {', '.join(mine)}" if mine else "reference (yours once it works)"


def progress(root: Path | None = None) -> tuple[list[Row], float, int]:
    """The table's rows, the seconds it took and how many exercises' tests ran."""
    root = root or find_root()
    start = time.perf_counter()
    plan: list[tuple[int, dict[str, str], list[Stub], str]] = []  # chapter, titles, stubs, problem
    to_run: list[str] = []
    for chapter in sorted(CHAPTERS):
        path = exercises_path(chapter, root)
        exercises = chapter_exercises(chapter, root) if path.exists() else {}
        if not exercises:
            continue
        try:
            stubs = find_stubs(path.read_text())
        except SyntaxError as e:
            plan.append((chapter, exercises, [], f"exercises.py does not parse (line {e.lineno}: {e.msg})"))
            continue
        try:
            given = committed_source(path, root)
            pristine, titles = find_stubs(given), exercise_titles(given)
        except (LookupError, SyntaxError):
            pristine, titles = None, {}  # cannot tell what was given: run every exercise's tests
        tested = tested_exercises(chapter, root)
        for e in exercises:
            left = {s.qualname for s in stubs if s.exercise == e}
            given = None if pristine is None else {s.qualname for s in pristine if s.exercise == e}
            if e in tested and not (given and left == given):
                to_run.append(e)
        plan.append((chapter, {e: t or titles.get(e, "") for e, t in exercises.items()}, stubs, ""))
    chapters_run = sorted({int(e.split(".")[0]) for e in to_run})
    outcomes, failure = run_exercise_tests(root, chapters_run, to_run)
    engine = engine_parts(root)
    rows = []
    for chapter, exercises, stubs, problem in plan:
        pairs = [(e, o) for e, o in outcomes if e in exercises]
        for e, result in results_for(chapter, pairs, stubs, root, titles=exercises).items():
            if problem:
                status = problem
            elif e not in to_run and result.stubs:
                status = NOT_STARTED
            elif failure and e in to_run:
                status = f"tests could not run: {failure.splitlines()[-1]}"
            else:
                status = result.describe()
            rows.append(Row(chapter, result, status, _engine_column(e, engine)))
    return rows, time.perf_counter() - start, len(to_run)


def format_table(rows: list[Row]) -> str:
    header = ("exercise", "title", "status", "engine (--impl learner)")
    cells = [(r.result.exercise, r.result.title, r.status, r.engine) for r in rows]
    widths = [max(len(c[i]) for c in [header, *cells]) for i in range(4)]  # titles whole: they are how
    lines = []  # a learner finds the notebook's section
    for c in [header, *cells]:
        lines.append(f"{c[0]:<{widths[0]}}  {c[1]:<{widths[1]}}  {c[2]:<{widths[2]}}  {c[3]}".rstrip())
    lines.insert(1, "-" * min(len(lines[0]), 120))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    root = find_root()
    rows, seconds, ran = progress(root)
    print(format_table(rows))
    print(f"\n{ENGINE_LEGEND}")
    passing = sum(r.status.startswith(PASSING) for r in rows)
    print(
        f"\n{passing} of {len(rows)} exercises pass. Checked in {seconds:.1f} s: the tests of {ran} "
        f"exercise{'s' if ran != 1 else ''} ran; those not started need none. "
        "`make test-exercise E=N.M` shows one exercise's tests in full."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
