"""Test mechanics of the workbook.

* ``--impl learner|solutions`` (or ``LLMRS_IMPL``): which module the chapter
  tests exercise — the learner's ``chapters/chNN_*/exercises.py`` (default)
  or ``solutions/chNN_*.py``. Tests receive it from the ``ex`` fixture.
* Every test under ``tests/chNN/`` is marked ``chNN``; under ``tests/core/``,
  ``core``.
* ``--exercise N.M`` (repeatable) runs only that exercise's tests
  (``test_exN_M_*``); an exercise the chapter does not have is a usage error
  that lists the ones it has.
* A test that fails because an exercise raises its ``NotImplementedError``
  is reported as *not implemented* (mark ``N``, no traceback) and still
  counts as a failure. A run of chapter tests ends with the workbook's own
  report: every stub left in the exercises that ran (found in the file, not
  only those a test reached), grouped by exercise; what the marks mean; and
  a last line with each exercise's status and the next step.
* ``--expect-stubs`` turns the chapter tests into a check of the untouched
  stubs: each test must fail with the pointed ``NotImplementedError``. A test
  that passes on a stub cannot fail, and one that errors otherwise hides the
  learner's message; both are reported.
"""

from __future__ import annotations

import builtins
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from llmrs_core.workbook import (
    CHAPTERS,
    IMPLS,
    TEST_NAME,
    chapter_exercises,
    current_impl,
    exercises,
    exercises_path,
    find_stubs,
    parse_exercise,
    say_exercises,
)
from llmrs_core.workbook.failures import RepeatedDiagnoses, without_introspection
from llmrs_core.workbook.report import LEGEND, PASSING, engine_parts, final_line, results_for, stub_lines

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
CHAPTER_DIR = re.compile(r"^ch(\d\d)$")
STUB_MESSAGE = re.compile(r"^Exercise \d+\.\d+ `")
NOT_IMPLEMENTED = "not implemented"
_EXCEPTION_GROUP = getattr(builtins, "BaseExceptionGroup", ())  # Python >= 3.11


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("llmrs workbook")
    group.addoption(
        "--impl",
        choices=IMPLS,
        default=None,
        help="implementation the chapter tests run against (default: $LLMRS_IMPL or learner)",
    )
    group.addoption(
        "--expect-stubs",
        action="store_true",
        help="check that every chapter test fails on the untouched stubs with 'not implemented'",
    )
    group.addoption(
        "--exercise",
        action="append",
        default=[],
        metavar="N.M",
        help="run only the tests of exercise N.M (test_exN_M_*); may be given more than once",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "core: engine tests (tests/core)")
    config.addinivalue_line("markers", "model: needs the real SmolLM2 model file (fetched if missing)")
    config.addinivalue_line("markers", "slow: a check `make test-slow` runs and `make test` leaves out for its time: a "
                            "real-model integration check (a fast test of the same property stays in `make test`)")
    for n in range(13):
        config.addinivalue_line("markers", f"ch{n:02d}: chapter {n} exercise tests")
    config.stash[_SELECTED] = _selected_exercises(config.getoption("--exercise"))


_SELECTED = pytest.StashKey[set]()  # exercises named by --exercise ("3.6")
_RUN = pytest.StashKey[dict]()  # chapter -> exercises whose tests were collected; None: not only chapter tests
_LAST_LINE = pytest.StashKey[str]()
_DIAGNOSES = pytest.StashKey[RepeatedDiagnoses]()  # learner runs: each diagnosis shown in full once


def _selected_exercises(values: list[str]) -> set[str]:
    """The ``--exercise`` values, checked against the exercises each chapter has."""
    selected = set()
    for value in values:
        try:
            chapter, exercise = parse_exercise(value)
        except ValueError as e:
            raise pytest.UsageError(str(e)) from None
        if chapter not in CHAPTERS:
            raise pytest.UsageError(f"there is no Exercise {exercise}: chapters are 0..{max(CHAPTERS)}")
        known = chapter_exercises(chapter, ROOT)
        if exercise not in known:
            raise pytest.UsageError(f"there is no Exercise {exercise}: {say_exercises(chapter, known)}")
        selected.add(exercise)
    return selected


def _exercise_of(name: str) -> str | None:
    """``test_ex3_6_softmax[case]`` -> ``"3.6"``."""
    m = TEST_NAME.match(name.rpartition("::")[2])
    return f"{int(m['n'])}.{int(m['m'])}" if m else None


def _chapter_of(path: Path) -> int | None:
    try:
        top = path.resolve().relative_to(TESTS).parts[0]
    except (ValueError, IndexError):
        return None
    m = CHAPTER_DIR.match(top)
    return int(m.group(1)) if m else None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        chapter = _chapter_of(item.path)
        if chapter is not None:
            item.add_marker(getattr(pytest.mark, f"ch{chapter:02d}"))
        elif item.path.resolve().is_relative_to(TESTS / "core"):
            item.add_marker(pytest.mark.core)
    selected = config.stash[_SELECTED]
    if selected:
        keep = [item for item in items if _exercise_of(item.name) in selected]
        config.hook.pytest_deselected(items=[item for item in items if _exercise_of(item.name) not in selected])
        items[:] = keep


def pytest_collection_finish(session: pytest.Session) -> None:
    run: dict[int, set[str]] | None = {}
    for item in session.items:
        chapter, exercise = _chapter_of(item.path), _exercise_of(item.name)
        if chapter is None or exercise is None:
            run = None  # engine tests too (make test-solutions): no workbook report
            break
        run.setdefault(chapter, set()).add(exercise)
    session.config.stash[_RUN] = run


# -- the module under test --------------------------------------------------


def _impl(config: pytest.Config) -> str:
    return config.getoption("--impl") or current_impl()


def _edited_by_learner(path: Path) -> bool:
    """True if git says the learner changed this exercises file (stub check then skips it)."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        return False
    proc = subprocess.run(
        ["git", "diff", "--quiet", "HEAD", "--", str(path)], cwd=ROOT, capture_output=True
    )
    return proc.returncode == 1


@pytest.fixture(scope="session")
def impl(request: pytest.FixtureRequest) -> str:
    """``learner`` or ``solutions``."""
    return _impl(request.config)


_module_cache: dict[tuple[int, str], object] = {}


@pytest.fixture
def ex(request: pytest.FixtureRequest, impl: str):
    """The module under test for this test's chapter (exercises or solutions)."""
    chapter = _chapter_of(request.path)
    if chapter is None:
        raise RuntimeError(f"the ex fixture is for tests under tests/chNN/, not {request.path}")
    if request.config.getoption("--expect-stubs") and _edited_by_learner(exercises_path(chapter, ROOT)):
        pytest.skip(f"stub check skipped: chapter {chapter}'s exercises.py has your edits")
    key = (chapter, impl)
    if key not in _module_cache:
        _module_cache[key] = exercises(chapter, impl, root=ROOT)
    return _module_cache[key]


# -- shared data --------------------------------------------------------------


@pytest.fixture(scope="session")
def model_path() -> Path:
    """The real SmolLM2 GGUF file, fetched on first use (``make test`` fetches it up front)."""
    from llmrs_core.fetch import fetch_model

    return fetch_model(quiet=True)


@pytest.fixture(scope="session")
def smollm2_gguf(model_path: Path):
    """The real model file, parsed by the engine's GGUF reader."""
    from llmrs_core.formats.gguf import read_gguf

    with read_gguf(model_path) as g:
        yield g


@pytest.fixture(scope="session")
def smollm2_tokenizer(smollm2_gguf):
    """SmolLM2's tokenizer, built by the engine from the GGUF metadata."""
    from llmrs_core.tokenizer import Tokenizer

    return Tokenizer.from_gguf(smollm2_gguf)


@pytest.fixture(scope="session")
def smollm2_reference(smollm2_tokenizer):
    """Hugging Face ``tokenizers`` configured as SmolLM2's: the reference for ours."""
    from llmrs_core.tokenizer.reference import reference_tokenizer

    return reference_tokenizer(smollm2_tokenizer)


@pytest.fixture(scope="session")
def hf_golden():
    """transformers' float32 run of SmolLM2 (tests/golden/smollm2_hf_golden.npz)."""
    import numpy as np

    return np.load(TESTS / "golden" / "smollm2_hf_golden.npz")


@pytest.fixture(scope="session")
def logprob_error(smollm2_gguf, hf_golden):
    """``logprob_error(backend, prompt=0)``: how far SmolLM2 run on ``backend`` is from transformers.

    Returns the largest absolute difference of the last position's
    log-probabilities (the engine's own NumPy path is below 1e-4).
    """
    import numpy as np

    from llmrs_core.backends import NumpyBackend
    from llmrs_core.config import ModelConfig
    from llmrs_core.model import LlamaModel

    net = LlamaModel(smollm2_gguf, ModelConfig.from_gguf(smollm2_gguf), NumpyBackend())

    def error(backend, prompt: int = 0) -> float:
        net.backend = backend  # same float32 weights, other operations
        logits = net.forward(hf_golden[f"ids_{prompt}"].tolist())[-1].astype(np.float64)
        lp = logits - logits.max()
        lp -= np.log(np.exp(lp).sum())
        return float(np.abs(lp[hf_golden[f"last_ids_{prompt}"]] - hf_golden[f"last_logprobs_{prompt}"]).max())

    return error


# -- "not implemented" reporting and the stub check ---------------------------


def _not_implemented_message(excinfo: pytest.ExceptionInfo | None) -> str | None:
    """The exercise's pointed message if the failure is an unimplemented stub."""
    if excinfo is None:
        return None
    exc = excinfo.value
    seen = 0
    while exc is not None and seen < 10:  # the stub may be wrapped (raise ... from)
        if isinstance(exc, NotImplementedError) and STUB_MESSAGE.match(str(exc)):
            return str(exc)
        if isinstance(exc, _EXCEPTION_GROUP) and exc.exceptions:
            exc = exc.exceptions[0]
        else:
            exc = exc.__cause__ or exc.__context__
        seen += 1
    return None


def _learner_failure(item: pytest.Item, call: pytest.CallInfo) -> bool:
    """A chapter test failing on the learner's code (not the stub check, not the solutions)."""
    return (call.when == "call" and call.excinfo is not None and _chapter_of(item.path) is not None
            and not item.config.getoption("--expect-stubs") and _impl(item.config) == "learner")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    learner_failure = _learner_failure(item, call)
    if learner_failure and isinstance(call.excinfo.value, AssertionError) and call.excinfo.value.args:
        # the exercise's message is the diagnosis: pytest's "assert ... + where <whole arrays>" below it goes
        # (read when the report is made, just below)
        exc = call.excinfo.value
        exc.args = (without_introspection(str(exc.args[0])), *exc.args[1:])
    outcome = yield
    rep = outcome.get_result()
    if call.when == "teardown" or _chapter_of(item.path) is None:
        return
    message = _not_implemented_message(call.excinfo) if rep.failed else None
    expect_stubs = item.config.getoption("--expect-stubs")

    if not expect_stubs:
        if message:
            rep.llmrs_not_implemented = message
            rep.longrepr = message
        elif learner_failure and rep.failed:  # one mistake, many tests: the diagnosis once, the rest a line each
            diagnoses = item.config.stash.setdefault(_DIAGNOSES, RepeatedDiagnoses())
            kind, text = type(call.excinfo.value).__name__, str(call.excinfo.value)
            first = diagnoses.seen(kind, text, item.name)
            if first is not None:
                rep.longrepr = RepeatedDiagnoses.one_line(kind, text, first)
        return

    # stub check: "not implemented" is the one right answer
    if message:
        if call.when == "call":
            rep.outcome, rep.longrepr = "passed", None
        else:  # raised while setting up; the test body cannot run, so report a skip
            rep.outcome = "skipped"
            rep.longrepr = (str(item.path), item.location[1] or 0, f"stub raised: {message}")
    elif call.when == "call" and rep.passed:
        rep.outcome = "failed"
        rep.longrepr = (
            "stub check: this test PASSED on the untouched stub, so it cannot catch a wrong "
            "implementation. Make it call the exercise."
        )
    elif rep.failed:
        rep.longrepr = (
            "stub check: expected the stub's NotImplementedError('Exercise N.M ...'), got:\n"
            f"{rep.longreprtext}"
        )


def pytest_report_teststatus(report: pytest.TestReport, config: pytest.Config):
    if getattr(report, "llmrs_not_implemented", None):
        return NOT_IMPLEMENTED, "N", "NOT IMPLEMENTED"
    return None


def _outcomes(stats: dict[str, list]) -> dict[str, str]:
    """nodeid -> the test's outcome over its phases ("not implemented" > "failed" > "skipped" > "passed")."""
    rank = {"passed": 0, "skipped": 1, "failed": 2, "not implemented": 3}
    category = {"passed": "passed", "failed": "failed", "error": "failed", "skipped": "skipped",
                NOT_IMPLEMENTED: "not implemented"}
    out: dict[str, str] = {}
    for key, reports in stats.items():
        outcome = category.get(key)
        for r in reports if outcome else ():
            nodeid = getattr(r, "nodeid", None)
            if nodeid and rank[outcome] >= rank[out.get(nodeid, "passed")]:
                out[nodeid] = outcome
    return out


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    """The workbook's report after a run of chapter tests (not with --expect-stubs)."""
    run = config.stash.get(_RUN, None)
    if config.getoption("--expect-stubs") or not run:
        return
    tr = terminalreporter
    impl = _impl(config)
    outcomes = _outcomes(tr.stats)
    last_lines, stub_report, legend = [], [], False
    engine = None
    for chapter in sorted(run):
        ran = run[chapter]
        stubs = []
        if impl == "learner":
            path = exercises_path(chapter, ROOT)
            try:
                stubs = [s for s in find_stubs(path.read_text()) if s.exercise in ran]
            except SyntaxError as e:
                last_lines.append(
                    f"Chapter {chapter}: {path.relative_to(ROOT)} does not parse (line {e.lineno}: {e.msg}); "
                    f"fix it, then run `make test-chapter {chapter}` again."
                )
                continue
            except FileNotFoundError:
                pass
        pairs = [
            (e, o) for nodeid, o in outcomes.items()
            if _chapter_of(ROOT / nodeid.split("::")[0]) == chapter and (e := _exercise_of(nodeid)) in ran
        ]
        results = {e: r for e, r in results_for(chapter, pairs, stubs, ROOT).items() if e in ran}
        stub_report += stub_lines(chapter, results.values(), ROOT)
        legend = legend or any(r.failed or r.not_implemented for r in results.values())
        if impl == "learner" and engine is None and all(r.status == PASSING for r in results.values()):
            engine = engine_parts(ROOT) or {}
        last_lines.append(final_line(chapter, results, impl, ROOT, engine))
    if stub_report:
        n = sum(1 for line in stub_report if line.startswith("    "))
        raises = "functions still raise" if n > 1 else "function still raises"
        tr.write_sep("-", f"not implemented yet: {n} {raises} NotImplementedError", yellow=True)
        for line in stub_report:
            tr.write_line(line)
    if legend:
        tr.write_line("")
        tr.write_line(LEGEND)
    config.stash[_LAST_LINE] = "\n".join(last_lines)


def pytest_unconfigure(config: pytest.Config) -> None:
    """The report's last line comes after pytest's own count of the tests."""
    line = config.stash.get(_LAST_LINE, "")
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if line and reporter is not None:
        reporter.write_line(line, bold=True)
