"""Keeping a bounded KV cache for contexts longer than the budget (chapter 5).

Two policies, both on a single sequence that is decoded one token at a time
after its prompt:

* **sliding window**: keep the last ``window`` tokens (a new token attends
  to them and to itself). Keys are stored rotated at their absolute
  positions, as usual.
* **attention sinks** (StreamingLLM, Xiao et al. 2023): keep the first
  ``n_sink`` tokens too. Models put large attention weight on the first
  tokens whatever they say — a "sink" for probability mass the softmax must
  place somewhere — so evicting them hurts far more than their content
  suggests. Positions are counted *within the cache*: keys are stored
  unrotated and rotated by their index in the cache when read, and the new
  query gets the next index. The model never sees a position beyond the
  cache size, however long the stream runs.

Both keep ``[budget, Hkv, D]`` per layer and compact after each step.
"""

from __future__ import annotations

from types import ModuleType

import numpy as np

from ..config import ModelConfig
from .base import KVCache


class _BoundedCache(KVCache):
    """``n_sink`` first tokens and the last ``window``; the eviction happens in :meth:`advance`."""

    def __init__(self, config: ModelConfig, n_sink: int, window: int, xp: ModuleType = np):
        if window <= 0 or n_sink < 0:
            raise ValueError(f"window must be positive and n_sink >= 0, got {window}, {n_sink}")
        self.n_sink, self.window = n_sink, window
        self.budget = n_sink + window
        shape = (config.n_layers, self.budget + window, config.n_kv_heads, config.head_dim)
        self.k = xp.zeros(shape, dtype=np.float32)
        self.v = xp.zeros(shape, dtype=np.float32)
        self.kept = 0  # tokens in the cache
        self.length = 0  # tokens seen in the stream (absolute position of the next one)
        self.evicted = 0

    def write(self, layer: int, k: np.ndarray, v: np.ndarray) -> None:
        t = k.shape[0]
        if self.kept + t > self.k.shape[1]:
            raise ValueError(
                f"{t} new tokens do not fit a cache of {self.budget} + {self.window}: "
                "feed a long prompt in chunks of at most `window` tokens"
            )
        self.k[layer, self.kept : self.kept + t] = k
        self.v[layer, self.kept : self.kept + t] = v

    def view(self, layer: int, n_new: int) -> tuple[np.ndarray, np.ndarray]:
        end = self.kept + n_new
        return self.k[layer, :end], self.v[layer, :end]

    def num_attended(self, n_new: int) -> int:
        """The kept tokens and the new ones: what :meth:`view` returns."""
        return self.kept + n_new

    def advance(self, n_new: int) -> None:
        self.kept += n_new
        self.length += n_new
        excess = self.kept - self.budget
        if excess > 0:  # drop the oldest tokens after the sinks
            s = self.n_sink
            self.k[:, s : self.kept - excess] = self.k[:, s + excess : self.kept].copy()
            self.v[:, s : self.kept - excess] = self.v[:, s + excess : self.kept].copy()
            self.kept -= excess
            self.evicted += excess


class SlidingWindowCache(_BoundedCache):
    """Keep the last ``window`` tokens; keys keep their absolute-position rotation
    (the default :meth:`~KVCache.positions`: absolute in the text)."""

    def __init__(self, config: ModelConfig, window: int, xp: ModuleType = np):
        super().__init__(config, 0, window, xp)


class SinkCache(_BoundedCache):
    """Keep the first ``n_sink`` tokens and the last ``window``; RoPE positions within the cache."""

    stores_unrotated_keys = True

    def __init__(self, config: ModelConfig, n_sink: int = 4, window: int = 256, xp: ModuleType = np):
        super().__init__(config, n_sink, window, xp)

    def positions(self, n_new: int) -> np.ndarray:
        """Queries sit at their index in the cache, not in the text."""
        return np.arange(self.kept, self.kept + n_new, dtype=np.int64)

    def key_positions(self, n_new: int) -> np.ndarray:
        """Every kept key (and the new ones) at its index in the cache."""
        return np.arange(self.kept + n_new, dtype=np.int64)
