"""The KV-cache interface: one sequence's keys and values, as the forward pass uses them (chapter 5).

``LlamaModel.forward_batch`` drives every cache the same way, per step of
``n`` new tokens::

    q_pos = cache.positions(n)            RoPE positions of the new queries (and keys)
    for each layer:
        cache.write(layer, k, v)          the new tokens' K/V, [n, Hkv, D]
        keys, values = cache.view(layer, n)   everything attended: [Tk, Hkv, D]
        if cache.stores_unrotated_keys:
            keys = rope(keys, cache.key_positions(n))
        attention(q, keys, values)
    cache.advance(n)                      only now does ``length`` grow

Implementations: the contiguous cache (chapter 4), one sequence of the paged
pool (``PagedKVCache.sequence``), and the bounded caches of
:mod:`~llmrs_core.kv_cache.eviction` (a sliding window; attention sinks,
which count positions within the cache and so store keys unrotated). The
cache decides *which* positions its tokens have; the model only applies
RoPE at the positions the cache names. Storage is allocated in the array
module the cache was given (``xp``: the backend's, so a GPU backend's caches
live on the GPU).
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np


class KVCache(ABC):
    """One sequence's cached keys and values; see the module docstring for the protocol.

    ``length`` (an attribute or a property) is the number of tokens of the
    sequence seen so far: the position of the next token, unless the cache
    numbers positions its own way (:meth:`positions`).
    """

    length: int
    #: keys are stored without RoPE and rotated at :meth:`key_positions` when read
    stores_unrotated_keys: bool = False

    @abstractmethod
    def write(self, layer: int, k: np.ndarray, v: np.ndarray) -> None:
        """Store the new tokens' ``k, v [T, Hkv, D]`` of ``layer`` (``length`` unchanged)."""

    @abstractmethod
    def view(self, layer: int, n_new: int) -> tuple[np.ndarray, np.ndarray]:
        """Keys and values attended by the new tokens, ``[Tk, Hkv, D]`` each, including
        the ``n_new`` just written (their queries are the last ``n_new`` of ``Tk``)."""

    @abstractmethod
    def advance(self, n_new: int) -> None:
        """After every layer has written: the ``n_new`` tokens are part of the sequence."""

    def positions(self, n_new: int) -> np.ndarray:
        """RoPE positions ``[n_new]`` (int64) of the next ``n_new`` tokens: by default
        ``length .. length + n_new - 1``."""
        return np.arange(self.length, self.length + n_new, dtype=np.int64)

    def num_attended(self, n_new: int) -> int:
        """How many keys :meth:`view` returns while ``n_new`` new tokens are written and not yet
        advanced: by default every position so far, ``length + n_new``; a bounded cache
        (:mod:`~llmrs_core.kv_cache.eviction`) keeps fewer."""
        return self.length + n_new

    def key_positions(self, n_new: int) -> np.ndarray:
        """RoPE positions ``[Tk]`` of the keys :meth:`view` returns; used only when
        :attr:`stores_unrotated_keys`. By default ``0 .. length + n_new - 1``."""
        return np.arange(self.length + n_new, dtype=np.int64)


__all__ = ["KVCache"]
