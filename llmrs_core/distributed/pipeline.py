"""A micro-batched pipeline: several sequence groups in flight, so that every stage keeps busy (chapter 11).

With one sequence a pipeline idles: stage 1 waits while stage 0 computes, then stage 0 waits for
the token (the *bubble*, half of every step with two stages). With ``G`` groups in flight,
stage 0 computes group ``g``'s next step while stage 1 finishes group ``g - 1``'s; the last
stage sends each new token back to stage 0, which needs it only ``G - 1`` steps later.

:class:`PipelineStage` is the :class:`~.plan.StepPlan` for this schedule: unlike
:class:`~.plan.PipelineParallel` it broadcasts nothing — the logits stay on the last stage
(other stages get an empty ``[R, 0]`` array) and :func:`pipelined_greedy` moves the tokens.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .communicator import Communicator
from .plan import Head, PipelineParallel


class PipelineStage(PipelineParallel):
    """Stage ``comm.rank`` of ``comm.world_size`` in a micro-batched pipeline: the stages, the
    activations sent on and the embedding are :class:`~.plan.PipelineParallel`'s; only the logits
    differ (kept on the last stage, not broadcast)."""

    def __init__(self, comm: Communicator, hidden_size: int):
        super().__init__(comm, hidden_size, vocab_size=0)  # no stage but the last has logits here

    def logits(self, x: np.ndarray, rows: np.ndarray | None, head: Head) -> np.ndarray:
        n = x.shape[0] if rows is None else len(rows)
        if not self.last:
            self.comm.send(np.ascontiguousarray(x, dtype=np.float32), self.stage + 1)
            return np.empty((n, 0), np.float32)
        return head(x if rows is None else x[rows])


def pipelined_greedy(net: Any, plan: PipelineStage, prompts: list[list[int]], n_tokens: int) -> list[list[int]]:
    """``n_tokens`` greedy tokens for each prompt, the prompts' groups interleaved through the stages
    (round ``s``: group 0, 1, ... each one step). ``net`` is this rank's stage
    (:class:`~llmrs_core.model.LlamaModel` with ``plan``); every rank calls this with the same
    arguments and gets the same tokens."""
    comm, last_rank = plan.comm, plan.n_stages - 1
    caches = [net.new_cache(len(p) + n_tokens) for p in prompts]
    tokens: list[list[int]] = [[] for _ in prompts]  # the last stage's; on stage 0, what it was sent
    box = np.zeros(1, np.int64)
    for step in range(n_tokens):
        for g, prompt in enumerate(prompts):
            if plan.first:
                if step > 0 and not plan.last:
                    tokens[g].append(int(comm.recv(box, last_rank)[0]))
                ids = prompt if step == 0 else tokens[g][-1:]
            else:  # a later stage reads the hidden state; the ids only say how many tokens
                ids = [0] * (len(prompt) if step == 0 else 1)
            logits = net.forward(np.asarray(ids), caches[g], last_only=True)
            if plan.last:
                tokens[g].append(int(np.argmax(logits[0])))
                if not plan.first and step < n_tokens - 1:
                    box[0] = tokens[g][-1]
                    comm.send(box, 0)
    return comm.gather_objects(tokens if plan.last else None)[last_rank]


__all__ = ["PipelineStage", "pipelined_greedy"]
