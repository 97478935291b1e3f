"""Shared by chapter 8's tests: a Numba compilation error told in the learner's terms."""

from __future__ import annotations

import pytest
from numba.core.errors import TypingError


def call_compiled(name, fn, *args):
    """Call ``fn(*args)``; if Numba cannot compile the learner's kernel ``name`` (``fn`` or a
    kernel it calls), fail with the first lines of Numba's error and how to debug it."""
    try:
        return fn(*args)
    except TypingError as e:
        first = str(e).strip().splitlines()[:6]
    # failed outside the except block, so that pytest does not print Numba's whole error above it
    pytest.fail(
        f"Numba could not compile {name}:\n    " + "\n    ".join(first)
        + "\nTo debug it as plain Python (with print), run with NUMBA_DISABLE_JIT=1.",
        pytrace=False,
    )


@pytest.fixture
def compiled():
    """``compiled(name, fn, *args)``: :func:`call_compiled`."""
    return call_compiled
