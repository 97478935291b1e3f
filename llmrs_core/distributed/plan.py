"""How one forward step is split across processes: the model's only distributed seam (chapter 11).

:class:`~llmrs_core.model.LlamaModel` calls a :class:`StepPlan` at four points of every
step and nothing else changes in its code::

    x = plan.embed(backend, table, ids)           # [T, d]
    ... per block:  x = x + plan.reduce(attention_out @ Wo_shard.T)
                    x = x + plan.reduce(mlp_hidden @ Wdown_shard.T)
    logits = plan.logits(x, rows, head)           # [R, vocab] on every rank

* :class:`SingleProcess`: the identity (one process; no cost).
* :class:`TensorParallel`: Megatron's split. ``reduce`` is the all-reduce after each
  row-parallel product (two per layer); a vocab-parallel ``embed`` looks up this rank's rows
  and all-reduces; the head computes this rank's vocabulary slice and all-gathers it.
* :class:`PipelineParallel`: stage ``s`` receives the hidden state from stage ``s - 1``,
  runs its layers and sends it on; the last stage computes the logits and broadcasts them,
  so every rank samples the same token (the generation loop runs on every rank alike).

Every rank calls the plan in the same order (SPMD), so the collectives match.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

import numpy as np

from .communicator import Communicator

Head = Callable[[np.ndarray], np.ndarray]


class StepPlan(ABC):
    """The communication points of one forward step (see the module docstring)."""

    @abstractmethod
    def embed(self, backend: Any, table: Any, ids: np.ndarray) -> np.ndarray:
        """The step's input hidden states ``[T, d]`` for token ids ``ids [T]``."""

    @abstractmethod
    def reduce(self, x: np.ndarray) -> np.ndarray:
        """Complete a row-parallel product ``x [T, d]`` (a partial sum on each rank)."""

    @abstractmethod
    def logits(self, x: np.ndarray, rows: np.ndarray | None, head: Head) -> np.ndarray:
        """Logits ``[R, vocab]`` of the final hidden states ``x [T, d]`` (rows ``rows`` of it, or
        all); ``head(x)`` is the output norm and this rank's head matrix."""


class SingleProcess(StepPlan):
    """One process holds the whole model: every point is the identity."""

    def embed(self, backend: Any, table: Any, ids: np.ndarray) -> np.ndarray:
        return backend.embed(table, ids)

    def reduce(self, x: np.ndarray) -> np.ndarray:
        return x

    def logits(self, x: np.ndarray, rows: np.ndarray | None, head: Head) -> np.ndarray:
        return head(x if rows is None else x[rows])


class TensorParallel(StepPlan):
    """Rank ``comm.rank`` of ``comm.world_size`` tensor-parallel ranks; ``vocab_rows`` are the
    token ids ``[lo, hi)`` of its embedding rows (the whole vocabulary when not vocab-parallel)."""

    def __init__(self, comm: Communicator, vocab_rows: tuple[int, int], vocab_size: int):
        self.comm, self.vocab_rows, self.vocab_size = comm, vocab_rows, vocab_size
        self.vocab_parallel = vocab_rows != (0, vocab_size)

    def embed(self, backend: Any, table: Any, ids: np.ndarray) -> np.ndarray:
        if not self.vocab_parallel:
            return backend.embed(table, ids)
        lo, hi = self.vocab_rows
        mine = (ids >= lo) & (ids < hi)
        x = np.array(backend.embed(table, np.where(mine, ids - lo, 0)), dtype=np.float32)
        x[~mine] = 0.0  # another rank holds these rows; its lookup plus our zeros is exact
        return self.comm.all_reduce(x)

    def reduce(self, x: np.ndarray) -> np.ndarray:
        return self.comm.all_reduce(np.ascontiguousarray(x, dtype=np.float32))

    def logits(self, x: np.ndarray, rows: np.ndarray | None, head: Head) -> np.ndarray:
        local = head(x if rows is None else x[rows])
        if not self.vocab_parallel:
            return local
        parts = self.comm.all_gather(np.ascontiguousarray(local, dtype=np.float32))  # [tp, R, V/tp]
        return np.ascontiguousarray(parts.transpose(1, 0, 2).reshape(local.shape[0], -1))


class PipelineParallel(StepPlan):
    """Stage ``comm.rank`` of ``comm.world_size``: rank ``s`` runs stage ``s``."""

    def __init__(self, comm: Communicator, hidden_size: int, vocab_size: int):
        self.comm, self.hidden_size, self.vocab_size = comm, hidden_size, vocab_size
        self.stage, self.n_stages = comm.rank, comm.world_size

    @property
    def first(self) -> bool:
        return self.stage == 0

    @property
    def last(self) -> bool:
        return self.stage == self.n_stages - 1

    def embed(self, backend: Any, table: Any, ids: np.ndarray) -> np.ndarray:
        if self.first:
            return backend.embed(table, ids)
        return self.comm.recv(np.empty((ids.size, self.hidden_size), np.float32), self.stage - 1)

    def reduce(self, x: np.ndarray) -> np.ndarray:
        return x

    def logits(self, x: np.ndarray, rows: np.ndarray | None, head: Head) -> np.ndarray:
        if not self.last:
            self.comm.send(np.ascontiguousarray(x, dtype=np.float32), self.stage + 1)
            n = x.shape[0] if rows is None else len(rows)
            out = np.empty((n, self.vocab_size), np.float32)
        else:
            out = np.ascontiguousarray(head(x if rows is None else x[rows]), dtype=np.float32)
        return self.comm.broadcast(out, root=self.n_stages - 1)


__all__ = ["Head", "PipelineParallel", "SingleProcess", "StepPlan", "TensorParallel"]
