"""The ``Communicator`` interface and its in-process implementation (chapter 11).

A communicator is one process's (or thread's) handle on a group of ``world_size``
ranks. The engine's distributed code is written against this interface only, so the
same tensor- and pipeline-parallel model runs on

* :class:`~llmrs_core.distributed.mpi.MPICommunicator`: separate processes under
  ``mpiexec`` (mpi4py over MPICH), on one machine or several;
* :class:`LocalCommunicator`: threads of one process, for fast tests and the notebook
  (:func:`run_local`).

Arrays are float32 (or any NumPy dtype MPI knows) and C-contiguous. The operations
are collective: every rank of the group calls them in the same order, with arrays of
the same shape, or they block (MPI) or fail after ``timeout`` seconds (threads).
"""

from __future__ import annotations

import queue
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

import numpy as np


class Communicator(ABC):
    """Collectives and point-to-point messages between the ranks of one group."""

    @property
    @abstractmethod
    def rank(self) -> int:
        """This rank's number, ``0 .. world_size - 1``."""

    @property
    @abstractmethod
    def world_size(self) -> int:
        """How many ranks the group has."""

    @abstractmethod
    def all_reduce(self, x: np.ndarray) -> np.ndarray:
        """Sum ``x`` over every rank, in place: on return every rank's ``x`` holds the sum.
        Returns ``x``."""

    @abstractmethod
    def all_gather(self, x: np.ndarray) -> np.ndarray:
        """Every rank's ``x`` (same shape on all) stacked in rank order: ``[world_size, *x.shape]``."""

    @abstractmethod
    def send(self, x: np.ndarray, dest: int, tag: int = 0) -> None:
        """Send ``x`` to rank ``dest`` (which calls :meth:`recv` with a buffer of its shape)."""

    @abstractmethod
    def recv(self, out: np.ndarray, source: int, tag: int = 0) -> np.ndarray:
        """Receive into ``out`` (its shape and dtype are the message's) from rank ``source``."""

    @abstractmethod
    def broadcast(self, x: np.ndarray, root: int = 0) -> np.ndarray:
        """Root's ``x`` copied into every rank's ``x`` (in place); returns ``x``."""

    @abstractmethod
    def barrier(self) -> None:
        """Return when every rank has called it."""

    @abstractmethod
    def gather_objects(self, obj: Any) -> list[Any]:
        """Every rank's small Python object, in rank order, on every rank (pickled: for
        start-up agreement and error reports, never on the hot path)."""

    @abstractmethod
    def abort(self, code: int = 1) -> None:
        """End every rank of the group now (after this rank has reported why)."""


class GroupBroken(RuntimeError):
    """A rank of an in-process group failed or timed out, so the collective cannot complete."""


class _Group:
    """State shared by the threads of one in-process group."""

    def __init__(self, world_size: int, timeout: float):
        self.world_size = world_size
        self.timeout = timeout
        self.barrier = threading.Barrier(world_size, timeout=timeout)
        self.slots: list[Any] = [None] * world_size
        self.mailboxes = {(s, d): queue.Queue() for s in range(world_size) for d in range(world_size)}

    def wait(self) -> None:
        try:
            self.barrier.wait()
        except threading.BrokenBarrierError:
            raise GroupBroken("another rank of the in-process group failed or timed out") from None


class LocalCommunicator(Communicator):
    """One thread's rank in an in-process group (made by :meth:`group`).

    ``all_reduce`` adds the ranks' arrays in rank order, so every rank gets the
    same bits. A rank that raises breaks the group: the others get
    :class:`GroupBroken` at their next collective instead of waiting forever.
    """

    def __init__(self, group: _Group, rank: int):
        self._group, self._rank = group, rank

    @classmethod
    def group(cls, world_size: int, timeout: float = 60.0) -> list[LocalCommunicator]:
        """``world_size`` communicators of one new group; collectives fail after ``timeout`` s."""
        if world_size < 1:
            raise ValueError(f"a group needs at least one rank; got world_size={world_size}")
        g = _Group(world_size, timeout)
        return [cls(g, r) for r in range(world_size)]

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._group.world_size

    def _exchange(self, value: Any) -> list[Any]:
        g = self._group
        g.slots[self._rank] = value
        g.wait()
        values = list(g.slots)
        g.wait()  # nobody overwrites a slot before everyone has read it
        return values

    def all_reduce(self, x: np.ndarray) -> np.ndarray:
        parts = self._exchange(x.copy())
        total = parts[0].copy()
        for p in parts[1:]:
            total += p
        x[...] = total
        return x

    def all_gather(self, x: np.ndarray) -> np.ndarray:
        return np.stack(self._exchange(x.copy()))

    def send(self, x: np.ndarray, dest: int, tag: int = 0) -> None:
        self._group.mailboxes[(self._rank, dest)].put((tag, np.array(x, copy=True)))

    def recv(self, out: np.ndarray, source: int, tag: int = 0) -> np.ndarray:
        try:
            got_tag, x = self._group.mailboxes[(source, self._rank)].get(timeout=self._group.timeout)
        except queue.Empty:
            raise GroupBroken(f"rank {self._rank}: nothing arrived from rank {source} "
                              f"in {self._group.timeout:g} s") from None
        if got_tag != tag or x.shape != out.shape:
            raise GroupBroken(f"rank {self._rank}: expected tag {tag} shape {out.shape} from rank {source}, "
                              f"got tag {got_tag} shape {x.shape}")
        out[...] = x
        return out

    def broadcast(self, x: np.ndarray, root: int = 0) -> np.ndarray:
        x[...] = self._exchange(x.copy() if self._rank == root else None)[root]
        return x

    def barrier(self) -> None:
        self._group.wait()

    def gather_objects(self, obj: Any) -> list[Any]:
        return self._exchange(obj)

    def abort(self, code: int = 1) -> None:
        self._group.barrier.abort()
        raise GroupBroken(f"rank {self._rank} aborted the group (code {code})")


def run_local(world_size: int, fn: Callable[[Communicator], Any], timeout: float = 60.0) -> list[Any]:
    """Run ``fn(comm)`` on ``world_size`` threads, one rank each; return their results in rank
    order. The first exception (other than the :class:`GroupBroken` it causes on the other
    ranks) is raised here once every thread has stopped."""
    comms = LocalCommunicator.group(world_size, timeout)
    results: list[Any] = [None] * world_size
    errors: list[BaseException | None] = [None] * world_size

    def main(rank: int) -> None:
        try:
            results[rank] = fn(comms[rank])
        except BaseException as e:  # noqa: BLE001 - reported below, after every rank has stopped
            errors[rank] = e
            comms[rank]._group.barrier.abort()

    threads = [threading.Thread(target=main, args=(r,), name=f"rank{r}") for r in range(world_size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    first = next((e for e in errors if e is not None and not isinstance(e, GroupBroken)), None)
    first = first or next((e for e in errors if e is not None), None)
    if first is not None:
        raise first
    return results


__all__ = ["Communicator", "GroupBroken", "LocalCommunicator", "run_local"]
