"""Where the server's handlers encode text: threads of their own, few, and short text first (chapter 11).

Tokenisation is pure Python: while it runs it holds the GIL for most of the
time. Run in asyncio's default executor (``asyncio.to_thread``: ``cpu + 4``
threads), six long prompts took every thread, and every other request's
encoding — a one-token completion's too — waited behind them for half a
minute. So encoding gets its own bounded pool, two lanes of one thread each:

* text of at most ``short_chars`` characters (a typical prompt: milliseconds) goes to
  the *short* lane, and never waits behind a long one;
* longer text goes to the *long* lane, one at a time.

More threads would not encode faster (the GIL), only make everyone wait
longer. Text too long for the context never gets here: the handlers refuse
it first, in O(n), on the event loop (:func:`llmrs_core.validation.precheck_text`).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")

#: text up to this many characters is encoded in the short lane (about 40 ms of BPE at most)
SHORT_TEXT_CHARS = 16_384


def text_size(value: object) -> int:
    """The size of the encoding work in ``value`` (prompts, messages): the characters of its strings
    plus one for every other item (a token id), however nested."""
    size, stack = 0, [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            size += len(item)
        elif isinstance(item, Mapping):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
        else:
            size += 1
    return size


class EncodePool:
    """Two one-thread lanes for encoding: :meth:`run` picks one by the text's size."""

    def __init__(self, short_chars: int | None = None):
        self.short_chars = SHORT_TEXT_CHARS if short_chars is None else short_chars
        self._short = ThreadPoolExecutor(max_workers=1, thread_name_prefix="llmrs-encode-short")
        self._long = ThreadPoolExecutor(max_workers=1, thread_name_prefix="llmrs-encode-long")

    async def run(self, size: int, fn: Callable[..., T], *args: object) -> T:
        """``fn(*args)`` in the lane for text of ``size`` characters; its result (or exception)."""
        lane = self._short if size <= self.short_chars else self._long
        return await asyncio.get_running_loop().run_in_executor(lane, functools.partial(fn, *args))

    def shutdown(self) -> None:
        """Stop the threads once their work is done; work still queued is cancelled."""
        for lane in (self._short, self._long):
            lane.shutdown(wait=False, cancel_futures=True)


__all__ = ["SHORT_TEXT_CHARS", "EncodePool", "text_size"]
