"""Test mechanics of the workbook.

* ``--impl learner|solutions`` (or ``LLMRS_IMPL``): which module the chapter
  tests exercise — the learner's ``chapters/chNN_*/exercises.py`` (default)
  or ``solutions/chNN_*.py``. Tests receive it from the ``ex`` fixture.
* Every test under ``tests/chNN/`` is marked ``chNN``; under ``tests/core/``,
  ``core``.
* A test that fails because an exercise raises its ``NotImplementedError``
  is reported as *not implemented* — one line per exercise at the end, no
  traceback — and still counts as a failure.
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

from llmrs_core.workbook import IMPLS, current_impl, exercises, exercises_path

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


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "core: engine tests (tests/core)")
    config.addinivalue_line("markers", "model: needs the real SmolLM2 model file (fetched if missing)")
    for n in range(13):
        config.addinivalue_line("markers", f"ch{n:02d}: chapter {n} exercise tests")


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


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
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


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    reports = terminalreporter.stats.get(NOT_IMPLEMENTED, [])
    if not reports:
        return
    messages = list(dict.fromkeys(r.llmrs_not_implemented for r in reports))
    tr = terminalreporter
    tr.write_sep("-", "exercises not implemented yet", yellow=True)
    for m in messages:
        tr.write_line(m)
    chapters = sorted(
        {c for r in reports if (c := _chapter_of(ROOT / r.nodeid.split("::")[0])) is not None}
    )
    tr.write_line("")
    for c in chapters:
        where = exercises_path(c, ROOT).relative_to(ROOT)
        tr.write_line(f"Implement them in {where}, then run `make test-chapter {c}` again.")
