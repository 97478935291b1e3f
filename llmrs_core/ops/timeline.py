"""Where a split model's time goes: a communicator that records every operation (chapter 11).

:class:`TimedCommunicator` wraps any :class:`~llmrs_core.distributed.communicator.Communicator` and records each
call as an :class:`Event` (operation, start, end, bytes) on this rank's clock. Time spent
inside a collective is communication *plus waiting* for the slowest rank: on an
oversubscribed machine most of it is waiting. :func:`summarise` turns one rank's events and
step times into the figures the notebook prints.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..distributed.communicator import Communicator


@dataclass(frozen=True)
class Event:
    """One communication call: ``op`` from ``start`` to ``end`` (seconds), ``nbytes`` sent by this rank."""

    op: str
    start: float
    end: float
    nbytes: int


@dataclass
class TimedCommunicator(Communicator):
    """``inner`` with every call recorded in :attr:`events` (times from :func:`time.perf_counter`)."""

    inner: Communicator
    events: list[Event] = field(default_factory=list)

    @property
    def rank(self) -> int:
        return self.inner.rank

    @property
    def world_size(self) -> int:
        return self.inner.world_size

    def _timed(self, op: str, nbytes: int, fn: Any, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        out = fn(*args, **kwargs)
        self.events.append(Event(op, start, time.perf_counter(), nbytes))
        return out

    def all_reduce(self, x: np.ndarray) -> np.ndarray:
        return self._timed("all_reduce", x.nbytes, self.inner.all_reduce, x)

    def all_gather(self, x: np.ndarray) -> np.ndarray:
        return self._timed("all_gather", x.nbytes, self.inner.all_gather, x)

    def send(self, x: np.ndarray, dest: int, tag: int = 0) -> None:
        self._timed("send", x.nbytes, self.inner.send, x, dest, tag)

    def recv(self, out: np.ndarray, source: int, tag: int = 0) -> np.ndarray:
        return self._timed("recv", 0, self.inner.recv, out, source, tag)

    def broadcast(self, x: np.ndarray, root: int = 0) -> np.ndarray:
        return self._timed("broadcast", x.nbytes if self.rank == root else 0, self.inner.broadcast, x, root)

    def barrier(self) -> None:
        self._timed("barrier", 0, self.inner.barrier)

    def gather_objects(self, obj: Any) -> list[Any]:
        return self.inner.gather_objects(obj)

    def abort(self, code: int = 1) -> None:
        self.inner.abort(code)


def summarise(events: list[Event], steps: list[tuple[float, float]]) -> dict[str, float]:
    """Per-step figures of one rank over ``steps`` (``(start, end)`` of each forward step):
    seconds per step, of which in communication (or waiting in it), and bytes all-reduced."""
    total = sum(e - s for s, e in steps)
    inside = [ev for ev in events if any(s <= ev.start < e for s, e in steps)]
    comm = sum(ev.end - ev.start for ev in inside)
    n = max(len(steps), 1)
    return {
        "step_s": total / n,
        "comm_s": comm / n,
        "compute_s": (total - comm) / n,
        "comm_share": comm / total if total else 0.0,
        "all_reduce_bytes": sum(ev.nbytes for ev in inside if ev.op == "all_reduce") / n,
        "all_reduces": sum(ev.op == "all_reduce" for ev in inside) / n,
        "sent_bytes": sum(ev.nbytes for ev in inside) / n,
    }


__all__ = ["Event", "TimedCommunicator", "summarise"]
