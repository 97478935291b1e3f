"""One forward step's batch, prepared outside the model (chapter 7; nano-vllm's per-step ``Context``).

``LlamaModel.forward_batch`` takes ``(ids, cache)`` pairs: each sequence's new tokens (a
prefill chunk or one decode token) and its KV cache. :func:`prepare_step` turns them into a
:class:`StepBatch`: the tokens of all sequences concatenated (``n`` rows), each token's RoPE
position, where each sequence's rows are, and which decode tokens of the engine's own paged
pool are written and attended together (one backend call per layer for all of them). The
layer loop then only reads it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .kv_cache.base import KVCache
from .kv_cache.paged import DecodeSlots, PagedKVCache, decode_group


@dataclass
class StepBatch:
    """Everything one step needs besides the weights. ``S`` sequences, ``n`` rows (tokens).

    Attributes:
        ids: ``[n]`` int64, every sequence's new tokens, sequence after sequence.
        positions: ``[n]`` each token's RoPE position (a cache with attention sinks names them).
        bounds: ``[S + 1]``: sequence ``j``'s rows are ``bounds[j]:bounds[j + 1]``.
        caches: the ``S`` caches; ``lengths``: their lengths before the step.
        unrotated: per sequence, whether its cache keeps keys unrotated (rotated when read).
        together: sequences whose one decode token is in ``pool`` and attended with one call
            per layer, at ``slots``; ``rows``: their rows of the step. ``apart``: the others.
        ends: ``[n]`` the length each token's sequence has after the step (longrope's choice).
    """

    ids: np.ndarray
    positions: np.ndarray
    bounds: np.ndarray
    caches: list[KVCache]
    lengths: list[int]
    unrotated: list[bool]
    together: list[int]
    apart: list[int]
    pool: PagedKVCache | None
    slots: DecodeSlots | None
    rows: np.ndarray
    ends: np.ndarray

    @property
    def n(self) -> int:
        """Rows (tokens) in the step."""
        return int(self.bounds[-1])

    @property
    def sizes(self) -> tuple[int, ...]:
        """Each sequence's number of new tokens."""
        return tuple(int(s) for s in np.diff(self.bounds))

    @property
    def last_rows(self) -> np.ndarray:
        """``[S]`` the row of each sequence's last token (whose logits predict the next)."""
        return self.bounds[1:] - 1


def prepare_step(batch: list[tuple[Any, KVCache]], vocab_size: int) -> StepBatch:
    """Check the ids (``ValueError`` naming the first bad one), ask each cache for its tokens'
    positions, and reserve the paged pool's slots for the decode tokens that go together.
    Nothing is written: a step that fails later leaves every cache as it was (only a reserved
    slot, which the next step reuses)."""
    all_ids = [np.asarray(ids, dtype=np.int64).reshape(-1) for ids, _ in batch]
    for ids in all_ids:
        if ids.size == 0:
            raise ValueError("forward() needs at least one token id")
        if ids.min() < 0 or ids.max() >= vocab_size:
            bad = ids[(ids < 0) | (ids >= vocab_size)][0]
            raise ValueError(f"token id {bad} is outside the vocabulary (0..{vocab_size - 1})")
    caches = [cache for _, cache in batch]
    sizes = [ids.size for ids in all_ids]
    bounds = np.cumsum([0, *sizes])
    # Each cache names its tokens' RoPE positions (attention sinks count within the cache) and
    # says whether it keeps keys unrotated.
    positions = np.concatenate([cache.positions(t) for cache, t in zip(caches, sizes)])
    lengths = [cache.length for cache in caches]
    unrotated = [cache.stores_unrotated_keys for cache in caches]
    pool, together, slots = None, [], None
    group = decode_group(caches, sizes)
    if group is not None:
        pool, together = group
        together = [j for j in together if not unrotated[j]]
        slots = pool.reserve_decode([caches[j].seq for j in together]) if together else None
    ends = np.repeat(np.asarray(lengths, dtype=np.int64) + sizes, sizes)
    return StepBatch(
        ids=np.concatenate(all_ids), positions=positions, bounds=bounds, caches=caches, lengths=lengths,
        unrotated=unrotated, together=together, apart=sorted(set(range(len(batch))) - set(together)),
        pool=pool, slots=slots, rows=bounds[together], ends=ends,
    )


__all__ = ["StepBatch", "prepare_step"]
