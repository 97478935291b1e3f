"""How a learner's failing exercise tests read: each diagnosis once, in the exercise's terms.

Used by ``tests/conftest.py`` on runs of the learner's code (``make test-chapter N``,
``make test-exercise E=N.M``, a notebook's ``run_tests`` cell). Not engine code.

Two things make a failure report long without saying more (issue 32):

* pytest's introspection of an ``assert`` that already has a message: after the
  exercise's own sentence come ``assert np.False_`` and ``+ where ...`` lines with
  whole arrays and texts. The message is the diagnosis; :func:`without_introspection`
  keeps it alone. A bare ``assert`` keeps pytest's explanation (it is all there is),
  each line cut to :data:`LINE_LIMIT` characters.
* one mistake failing many tests (the parametrised cases of one property, say):
  :class:`RepeatedDiagnoses` shows the first in full and each later one with the same
  diagnosis as one line naming the first. Diagnoses are the same when they differ only
  in numbers (the values of each case).
"""

from __future__ import annotations

import re

#: the longest line of pytest's explanation kept for a bare ``assert``
LINE_LIMIT = 160
_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")


def without_introspection(message: str) -> str:
    """An ``AssertionError``'s text with pytest's explanation dropped where the test gave a
    message (pytest appends it as a line starting ``assert``); for a bare ``assert``, the
    explanation with each line cut to :data:`LINE_LIMIT` characters; any other text as it is
    (an ``AssertionError`` the test's own helpers raise is all diagnosis)."""
    lines = message.split("\n")
    start = next((i for i, line in enumerate(lines) if line.startswith("assert ")), None)
    if start is None:  # raised by the test's own code (assert_matches, say): all of it is the diagnosis
        return message
    if start > 0:
        return "\n".join(lines[:start]).rstrip()
    return "\n".join(line if len(line) <= LINE_LIMIT else line[: LINE_LIMIT - 1] + "…" for line in lines)


def diagnosis_key(kind: str, message: str) -> str:
    """What two failures must share to be the same diagnosis: the exception's kind and its
    message with every number replaced (each parametrised case prints its own values)."""
    return kind + ": " + _NUMBER.sub("#", message.strip())


def first_line(message: str, limit: int = LINE_LIMIT) -> str:
    line = message.strip().split("\n", 1)[0]
    return line if len(line) <= limit else line[: limit - 1] + "…"


class RepeatedDiagnoses:
    """The diagnoses of one run, by key, with the test that showed each first."""

    def __init__(self) -> None:
        self._first: dict[str, str] = {}

    def seen(self, kind: str, message: str, test: str) -> str | None:
        """The test that already showed this diagnosis, or None (then ``test`` is the one that shows it)."""
        key = diagnosis_key(kind, message)
        if key in self._first:
            return self._first[key]
        self._first[key] = test
        return None

    @staticmethod
    def one_line(kind: str, message: str, first: str) -> str:
        """A repeat's report: its own first line and where the diagnosis was shown in full."""
        return f"{kind}: {first_line(message)}  (the same diagnosis as {first}, shown in full above)"
