"""What a learner reads after running exercise tests: the stubs left, each exercise's status,
and the next step.

Used by ``tests/conftest.py`` at the end of ``make test-chapter N`` and
``make test-exercise E=N.M``, and by ``make progress``
(:mod:`llmrs_core.workbook.progress`). Not engine code.

An exercise's status, from its tests' outcomes:

* ``passing``: every test passed (skipped ones aside), and no function of it is still a stub;
* ``not started``: every test reached a stub (nothing of it runs yet);
* ``in progress``: no test fails, but some reach a stub or stubs are left that no test reached;
* ``failing``: some tests fail;
* ``skipped``: every test was skipped here (a GPU exercise on a machine without one, say);
* ``no tests yet``: the chapter is still being written.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from . import CHAPTERS, Stub, chapter_exercises, exercise_key, exercises_path

PASSING, FAILING, NOT_STARTED, SKIPPED, NO_TESTS = "passing", "failing", "not started", "skipped", "no tests yet"
IN_PROGRESS = "in progress"
#: outcomes of one test, as tallied here
OUTCOMES = ("passed", "failed", "not implemented", "skipped")
#: what pytest's progress marks mean in a chapter run (``N`` is the workbook's)
LEGEND = "Marks, one per test: . passed  F failed  E error  s skipped  N not implemented yet (reached a stub)"


@dataclass
class ExerciseResult:
    """The tests of one exercise, tallied, and the stubs it has left."""

    exercise: str  # "3.6"
    title: str = ""
    passed: int = 0
    failed: int = 0
    not_implemented: int = 0
    skipped: int = 0
    stubs: list[Stub] = field(default_factory=list)

    def add(self, outcome: str) -> None:
        if outcome not in OUTCOMES:
            raise ValueError(f"unknown test outcome {outcome!r}; expected one of {OUTCOMES}")
        name = outcome.replace(" ", "_")
        setattr(self, name, getattr(self, name) + 1)

    @property
    def tests(self) -> int:
        return self.passed + self.failed + self.not_implemented + self.skipped

    @property
    def status(self) -> str:
        if self.tests == 0:
            return NO_TESTS
        if self.failed == 0 and self.not_implemented == 0:
            if self.stubs and self.passed:
                return IN_PROGRESS  # its tests pass, but some of its functions are still stubs
            return PASSING if self.passed else SKIPPED
        if self.passed == 0 and self.failed == 0:
            return NOT_STARTED
        return IN_PROGRESS if self.failed == 0 else FAILING  # "failing" only where a test fails

    def describe(self) -> str:
        """``"failing: 5 of 7 tests pass, 1 function left to write"``; ``"in progress: ..."`` where
        no test fails yet."""
        run = self.tests - self.skipped
        if self.status == PASSING:
            text = f"{PASSING}: all {self.passed} tests pass"
        elif self.status == NOT_STARTED:
            text = NOT_STARTED
        elif self.status in (FAILING, IN_PROGRESS):
            text = f"{self.status}: {self.passed} of {run} tests pass"
        else:
            text = self.status
        if self.skipped and self.status != NO_TESTS:
            text += f" ({self.skipped} skipped here)"
        if self.stubs and self.status != PASSING:
            n = len(self.stubs)
            text += f", {n} function{'s' if n > 1 else ''} left to write"
        return text


def results_for(
    chapter: int, outcomes: Iterable[tuple[str, str]], stubs: Iterable[Stub] = (), root: Path | None = None,
    titles: dict[str, str] | None = None,
) -> dict[str, ExerciseResult]:
    """``{exercise: ExerciseResult}`` for ``chapter``, in order, from ``(exercise, outcome)`` pairs
    (one per test) and the stubs left in the learner's file; ``titles`` fill in those its
    docstring no longer gives."""
    found = chapter_exercises(chapter, root)
    results = {e: ExerciseResult(e, title or (titles or {}).get(e, "")) for e, title in found.items()}
    for exercise, outcome in outcomes:
        results.setdefault(exercise, ExerciseResult(exercise)).add(outcome)
    for stub in stubs:
        results.setdefault(stub.exercise, ExerciseResult(stub.exercise)).stubs.append(stub)
    return {e: results[e] for e in sorted(results, key=exercise_key)}


def stub_lines(chapter: int, results: Iterable[ExerciseResult], root: Path) -> list[str]:
    """The stubs left, grouped by exercise, each with ``file:line`` (empty when there are none)."""
    where = exercises_path(chapter, root).relative_to(root)
    lines: list[str] = []
    for r in results:
        if not r.stubs:
            continue
        section = re.search(r"see (.+)$", r.stubs[0].message)
        lines.append(f"Exercise {r.exercise}  {r.title}" + (f"  ({section.group(1)})" if section else ""))
        width = max(len(s.qualname) for s in r.stubs)
        lines += [f"    {s.qualname:<{width}}  {where}:{s.line}" for s in r.stubs]
    return lines


def engine_parts(root: Path | None = None) -> dict[str, list[str]] | None:
    """``{"3.6": ["attention"], ...}``: what the engine runs of the learner's code with
    ``--impl learner`` (the parts where the learner backend chose theirs), by exercise.

    Each exercise that plugs into the engine is listed, with an empty list while the
    reference stands in for it. None when the learner backend cannot start here.
    """
    from .learner import LearnerBackend

    try:
        backend = LearnerBackend(root=root)
    except Exception:  # noqa: BLE001 — chapters 3-4 missing, or the learner's file does not even import
        return None
    parts: dict[str, list[str]] = {}
    for part in backend.parts.values():
        mine = parts.setdefault(part.exercise, [])
        if part.source == "yours":
            mine.append(part.name)
    return parts


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def next_step(chapter: int, exercises_run: list[str], root: Path) -> str:
    """Where to go after ``exercises_run`` pass: the chapter's next exercise, or the next chapter."""
    own = list(chapter_exercises(chapter, root))
    if len(exercises_run) == 1 and exercises_run[0] in own:
        later = own[own.index(exercises_run[0]) + 1 :]
        if later:
            return f"Next: Exercise {later[0]}, `make test-exercise E={later[0]}`."
    for c in sorted(CHAPTERS):
        if c > chapter and chapter_exercises(c, root):
            return f"Next: chapter {c}, `make test-chapter {c}`."
    return "That was the last chapter with exercises: `make progress` shows them all."


def rerun_command(chapter: int, exercises_run: list[str], root: Path) -> str:
    if len(exercises_run) == 1 and len(chapter_exercises(chapter, root)) > 1:
        return f"make test-exercise E={exercises_run[0]}"
    return f"make test-chapter {chapter}"


def final_line(
    chapter: int, results: dict[str, ExerciseResult], impl: str, root: Path,
    engine: dict[str, list[str]] | None = None,
) -> str:
    """The run's last line: success and the next step, or what is left and where to start."""
    run = [r for r in results.values() if r.tests]
    if not run:  # e.g. pytest --collect-only
        return f"Chapter {chapter}: no exercise tests ran."
    names = [r.exercise for r in run]
    what = f"Exercise {names[0]}" if len(names) == 1 else f"Chapter {chapter} (Exercises {_and(names)})"
    if all(r.status in (PASSING, SKIPPED) for r in run):
        if impl != "learner":
            return f"The reference solutions pass {what}."
        text = f"{what} passes"
        mine = [p for e in names for p in (engine or {}).get(e, [])]
        if mine:
            text += (
                f": your {_and(mine)} now run{'s' if len(mine) == 1 else ''} inside the engine — try "
                '`.venv/bin/llmrs generate --impl learner "The capital of France is"`'
            )
        # engine is empty where the learner backend could not start: then no exercise is said to be outside it
        outside = [e for e in names if engine and e not in engine]
        if outside:
            if outside == names:
                who = "it is" if len(names) == 1 else "they are"
            else:
                who = f"Exercise {outside[0]} is" if len(outside) == 1 else f"Exercises {_and(outside)} are"
            text += (
                f"{'; ' if mine else ': '}{who} not part of the engine, so your code runs where the notebook calls "
                f"it: the cells of section{'s' if len(outside) > 1 else ''} {_and(outside)} in {CHAPTERS[chapter]}.ipynb"
            )
        return f"{text}. {next_step(chapter, names, root)}"
    states = "; ".join(f"Exercise {r.exercise} {r.describe()}" for r in run if r.status != PASSING)
    if impl != "learner":
        return f"The reference solutions fail {what}: {states}."
    rerun = rerun_command(chapter, names, root)
    first = next((s for r in run if r.status != PASSING for s in r.stubs), None)
    where = exercises_path(chapter, root).relative_to(root)
    todo = (
        f"start with `{first.qualname}` ({where}:{first.line})" if first is not None
        and all(r.failed == 0 for r in run) else "fix the failures above"
    )
    return f"Chapter {chapter}: {states}. Next: {todo}, then run `{rerun}` again."
