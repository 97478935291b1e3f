"""One request's output stream: sampled token ids in, text safe to stream out (chapters 4 and 7).

``model.generate`` (one prompt), the continuous-batching engine (many) and
the server (chapter 11) all turn tokens into text through this one class, so
they cannot drift apart. For every token it is fed it returns the text that
became final and, once the request is over, why. It guarantees what a
streaming client needs:

* every delta is whole characters: a character spread over several byte
  tokens (an emoji, CJK) is held back until its last byte arrives, so no
  delta splits one and no U+FFFD is produced by splitting;
* text that could be the start of a stop string is held back until it is
  clear whether it is one; a stop string is never emitted, nor what follows;
* the deltas, concatenated, are exactly the final text;
* the finish reason is ``"stop"`` (an end-of-turn token or a stop string),
  ``"length"`` (``max_tokens`` reached), ``"abort"`` (cancelled) or
  ``"error"`` (the engine could not compute this request; :attr:`error` says why).

When ``max_tokens`` ends the stream in the middle of a character, its
incomplete bytes are dropped from the text (their token ids stay in
``token_ids``): half a character is not text. Bytes that are invalid UTF-8
in the middle of the output become U+FFFD, as in ``Tokenizer.decode``: the
model really produced broken text.
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .tokenizer import Tokenizer

FINISH_REASONS = ("stop", "length", "abort", "error")


class _StopAutomaton:
    """Aho–Corasick over a tuple of stop strings: after each character, in constant time
    (amortised), the longest suffix of the text that begins some stop string (its ``depth``:
    what to hold back) and the first-listed stop string that ends at that character, if any
    (``match``; -1: none). Built once per set of stop strings (:func:`_automaton`, cached)."""

    def __init__(self, stops: tuple[str, ...]):
        goto: list[dict[str, int]] = [{}]
        depth, match = [0], [-1]
        for i, s in enumerate(stops):
            node = 0
            for c in s:
                child = goto[node].get(c)
                if child is None:
                    child = len(goto)
                    goto[node][c] = child
                    goto.append({})
                    depth.append(depth[node] + 1)
                    match.append(-1)
                node = child
            if match[node] < 0:
                match[node] = i
        fail = [0] * len(goto)
        queue = deque(goto[0].values())
        while queue:  # breadth first: a node's failure target is shallower, hence finished
            node = queue.popleft()
            for c, child in goto[node].items():
                f = fail[node]
                while f and c not in goto[f]:
                    f = fail[f]
                target = goto[f].get(c, 0)
                fail[child] = target
                if match[target] >= 0 and (match[child] < 0 or match[target] < match[child]):
                    match[child] = match[target]  # a shorter stop string ends here too
                queue.append(child)
        self.goto, self.fail, self.depth, self.match = goto, fail, depth, match


@functools.lru_cache(maxsize=64)
def _automaton(stops: tuple[str, ...]) -> _StopAutomaton:
    return _StopAutomaton(stops)


class StopStringFilter:
    """Passes text through, holding back any tail that could begin a stop string.

    The text ends before the first stop string to complete (of those completing at the same
    character, the first listed). Each character costs the same whatever the number and length
    of the stop strings (an Aho–Corasick automaton, :class:`_StopAutomaton`): the engine runs
    this for every token of every request, and one request's stop list must not slow the
    others (``validation.MAX_STOP_STRINGS`` bounds the automaton's size).
    """

    def __init__(self, stops: Sequence[str]):
        self.stops = [s for s in stops if s]
        self.pending = ""
        self.hit: str | None = None
        self._automaton = _automaton(tuple(self.stops)) if self.stops else None
        self._state = 0

    def feed(self, text: str) -> str:
        a = self._automaton
        if a is None:
            return text
        goto, fail, match = a.goto, a.fail, a.match
        state = self._state
        for i, c in enumerate(text):
            while state and c not in goto[state]:
                state = fail[state]
            state = goto[state].get(c, 0)
            if match[state] >= 0:
                self.hit = self.stops[match[state]]
                seen = self.pending + text[: i + 1]
                self.pending, self._state = "", 0
                return seen[: len(seen) - len(self.hit)]
        self._state = state
        self.pending += text
        out = self.pending[: len(self.pending) - a.depth[state]]
        self.pending = self.pending[len(out) :]
        return out

    def flush(self) -> str:
        out, self.pending, self._state = self.pending, "", 0
        return out


class OutputStream:
    """The output of one request, fed one sampled token at a time.

    Args:
        tokenizer: turns tokens into text; ``None`` for a model without one
            (then the text is empty and ``stop`` must be too).
        max_tokens: the most tokens to generate (>= 1).
        stop: stop strings; the text ends before the first one found.
        stop_token_ids: tokens that end the request (end-of-turn, EOS); they
            are not part of the output.
    """

    def __init__(
        self,
        tokenizer: Tokenizer | None,
        max_tokens: int,
        stop: Sequence[str] = (),
        stop_token_ids: Iterable[int] = (),
    ):
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {max_tokens}")
        if tokenizer is None and any(stop):
            raise ValueError("stop strings need a tokenizer to see text, and this model has none")
        self.max_tokens = max_tokens
        self.stop_token_ids = frozenset(int(t) for t in stop_token_ids)
        self.token_ids: list[int] = []
        self.finish_reason: str | None = None
        #: what ended it: the stop string, the stop token id, or None
        self.stop_reason: str | int | None = None
        #: why the request failed, for finish reason "error"
        self.error: str | None = None
        self._decoder = tokenizer.stream_decoder(skip_special=True) if tokenizer is not None else None
        self._stops = StopStringFilter(stop)
        self._deltas: list[str] = []

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def text(self) -> str:
        """All text emitted so far (the final text once :attr:`finished`)."""
        return "".join(self._deltas)

    def feed(self, token: int) -> tuple[str, str | None]:
        """Take the next sampled token: ``(text that became final, finish reason or None)``."""
        if self.finished:
            raise RuntimeError(f"the stream already finished ({self.finish_reason}); it takes no more tokens")
        token = int(token)
        if token in self.stop_token_ids:
            self.stop_reason = token
            return self._finish("stop", self._tail()), "stop"
        self.token_ids.append(token)
        if self._decoder is None:
            delta = ""
        else:
            delta = self._stops.feed(self._decoder.add(token))
        if self._stops.hit is not None:
            self.stop_reason = self._stops.hit
            return self._finish("stop", delta), "stop"
        if len(self.token_ids) >= self.max_tokens:
            return self._finish("length", delta + self._tail()), "length"
        return self._emit(delta), None

    def abort(self) -> str:
        """Cancel: finish with ``"abort"``; returns the held-back text that is now final."""
        if self.finished:
            return ""
        return self._finish("abort", self._tail())

    def fail(self, message: str) -> str:
        """Finish with ``"error"``: the request could not go on (``message`` says why)."""
        if self.finished:
            return ""
        self.error = message
        return self._finish("error", self._tail())

    def _tail(self) -> str:
        """What is held back, released at the end: text that looked like the start of a
        stop string but never became one. The UTF-8 decoder holds back only the bytes of
        an incomplete character, and those are dropped (never turned into U+FFFD)."""
        return self._stops.flush()

    def _emit(self, delta: str) -> str:
        if delta:
            self._deltas.append(delta)
        return delta

    def _finish(self, reason: str, delta: str) -> str:
        self.finish_reason = reason
        return self._emit(delta)


__all__ = ["FINISH_REASONS", "OutputStream", "StopStringFilter"]
