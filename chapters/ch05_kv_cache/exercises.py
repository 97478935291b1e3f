"""Chapter 5 — KV Caching and Autoregressive Optimization: your exercises.

Exercise 5.6  Implementing a Contiguous KV Cache  (ch05_kv_cache.ipynb, section 5.6)
Exercise 5.7  Implementing PagedAttention          (ch05_kv_cache.ipynb, section 5.7)

Check your work with ``make test-chapter 5`` (or ``make test-exercise E=5.7``).

Shapes: L = n_layers, Hkv = n_kv_heads, D = head_dim, T = new tokens.
The model's forward pass (``llmrs_core.model.LlamaModel.forward(ids, cache)``)
accepts any :class:`~llmrs_core.kv_cache.base.KVCache`: ``length``,
``write(layer, k, v)``, ``view(layer, n_new)`` and ``advance(n_new)``. Your
cache inherits the interface (and its default RoPE positions): plug it in and
SmolLM2 runs on it.

``xp`` is the array module the storage lives in: ``xp.zeros(...)`` instead of
``np.zeros(...)``, and the same code keeps a GPU backend's cache on the GPU
(chapter 9). On the CPU it is NumPy itself.
"""

from __future__ import annotations

from collections.abc import Hashable
from types import ModuleType

import numpy as np

from llmrs_core.config import ModelConfig
from llmrs_core.kv_cache.base import KVCache
from llmrs_core.kv_cache.contiguous import CacheFullError
from llmrs_core.kv_cache.paged import OutOfBlocksError, PagedSequence

__all__ = [
    "BlockAllocator",
    "CacheFullError",
    "ContiguousKVCache",
    "OutOfBlocksError",
    "PagedKVCache",
    "paged_attention",
]


# -- Exercise 5.6: a contiguous KV cache ------------------------------------------


class ContiguousKVCache(KVCache):
    """Preallocated K and V for one sequence: ``self.k`` and ``self.v`` are
    ``[L, Hkv, max_tokens, D]`` arrays of zeros; ``self.length`` counts the
    cached positions; ``self.max_tokens`` is the capacity.
    """

    def __init__(self, config: ModelConfig, max_tokens: int, dtype: type = np.float32, xp: ModuleType = np):
        """Allocate ``k`` and ``v`` (layout above, ``xp.zeros``) and set ``length = 0``.
        A ``max_tokens <= 0`` raises ``ValueError``."""
        raise NotImplementedError(
            "Exercise 5.6 `ContiguousKVCache.__init__`: not implemented yet — see ch05_kv_cache.ipynb §5.6"
        )

    def write(self, layer: int, k: np.ndarray, v: np.ndarray) -> None:
        """Store ``k, v [T, Hkv, D]`` of ``layer`` at positions ``length .. length + T - 1``
        (note the transpose to the ``[Hkv, T, D]`` layout). Do not change ``length``:
        every layer writes the same positions. Past ``max_tokens``: ``CacheFullError``."""
        raise NotImplementedError(
            "Exercise 5.6 `ContiguousKVCache.write`: not implemented yet — see ch05_kv_cache.ipynb §5.6"
        )

    def view(self, layer: int, n_new: int) -> tuple[np.ndarray, np.ndarray]:
        """K and V of positions ``0 .. length + n_new - 1`` of ``layer`` as ``[Tk, Hkv, D]``
        (views, no copies: ``transpose`` gives one)."""
        raise NotImplementedError(
            "Exercise 5.6 `ContiguousKVCache.view`: not implemented yet — see ch05_kv_cache.ipynb §5.6"
        )

    def advance(self, n_new: int) -> None:
        """After every layer has written: ``length += n_new``."""
        raise NotImplementedError(
            "Exercise 5.6 `ContiguousKVCache.advance`: not implemented yet — see ch05_kv_cache.ipynb §5.6"
        )

    @property
    def nbytes(self) -> int:
        """Bytes of ``k`` and ``v`` together."""
        raise NotImplementedError(
            "Exercise 5.6 `ContiguousKVCache.nbytes`: not implemented yet — see ch05_kv_cache.ipynb §5.6"
        )


# -- Exercise 5.7: PagedAttention ----------------------------------------------------


class BlockAllocator:
    """A fixed pool of ``num_blocks`` block ids (``self.num_blocks``) with reference counts.

    ``self.ref_counts[b]`` is the number of sequences holding block ``b``
    (0 = free). Hand out free blocks in order (a ``collections.deque`` of free ids).
    """

    def __init__(self, num_blocks: int):
        """All blocks free; ``num_blocks <= 0`` raises ``ValueError``."""
        raise NotImplementedError(
            "Exercise 5.7 `BlockAllocator.__init__`: not implemented yet — see ch05_kv_cache.ipynb §5.7"
        )

    @property
    def num_free(self) -> int:
        raise NotImplementedError(
            "Exercise 5.7 `BlockAllocator.num_free`: not implemented yet — see ch05_kv_cache.ipynb §5.7"
        )

    @property
    def num_used(self) -> int:
        raise NotImplementedError(
            "Exercise 5.7 `BlockAllocator.num_used`: not implemented yet — see ch05_kv_cache.ipynb §5.7"
        )

    def allocate(self) -> int:
        """Take a free block, set its count to 1 and return it; none left: ``OutOfBlocksError(1, 0)``."""
        raise NotImplementedError(
            "Exercise 5.7 `BlockAllocator.allocate`: not implemented yet — see ch05_kv_cache.ipynb §5.7"
        )

    def incref(self, block: int) -> None:
        """One more holder; a free block raises ``RuntimeError``."""
        raise NotImplementedError(
            "Exercise 5.7 `BlockAllocator.incref`: not implemented yet — see ch05_kv_cache.ipynb §5.7"
        )

    def decref(self, block: int) -> None:
        """One holder fewer; at 0 the block is free again. Freeing a free block raises ``RuntimeError``."""
        raise NotImplementedError(
            "Exercise 5.7 `BlockAllocator.decref`: not implemented yet — see ch05_kv_cache.ipynb §5.7"
        )


class PagedKVCache:
    """K and V of many sequences in one pool of blocks.

    ``self.k[layer]`` and ``self.v[layer]`` are ``[num_blocks, Hkv, block_size, D]``
    (so ``self.k`` is ``[L, num_blocks, Hkv, block_size, D]``).
    ``self.tables[seq]`` lists the sequence's physical blocks in order and
    ``self.lengths[seq]`` its stored tokens: position ``p`` lives in slot
    ``p % block_size`` of block ``tables[seq][p // block_size]``.
    ``self.allocator`` is a :class:`BlockAllocator`; ``self.block_size`` the block size.
    """

    def __init__(
        self, config: ModelConfig, num_blocks: int, block_size: int = 16, dtype: type = np.float32,
        xp: ModuleType = np,
    ):
        """Pools of zeros (``xp.zeros``), an allocator of ``num_blocks``, no sequences."""
        raise NotImplementedError(
            "Exercise 5.7 `PagedKVCache.__init__`: not implemented yet — see ch05_kv_cache.ipynb §5.7"
        )

    def add_sequence(self, seq: Hashable) -> None:
        """An empty table and length 0; an existing ``seq`` raises ``ValueError``."""
        raise NotImplementedError(
            "Exercise 5.7 `PagedKVCache.add_sequence`: not implemented yet — see ch05_kv_cache.ipynb §5.7"
        )

    def can_append(self, seq: Hashable, n: int) -> bool:
        """Would :meth:`reserve` of ``n`` tokens succeed (counting a copy-on-write block)?"""
        raise NotImplementedError(
            "Exercise 5.7 `PagedKVCache.can_append`: not implemented yet — see ch05_kv_cache.ipynb §5.7"
        )

    def reserve(self, seq: Hashable, n: int) -> None:
        """Make room for ``n`` more tokens of ``seq``.

        Allocate blocks only when the tokens cross a block boundary. If the
        last block is partly filled and shared (ref count > 1), copy it first
        (copy-on-write: a fresh block with the same K/V in every layer,
        replacing it in this table, one reference fewer on the old one).
        All or nothing: if the free blocks do not suffice, raise
        ``OutOfBlocksError(needed, free)`` and change nothing. Unknown ``seq``: ``KeyError``.
        """
        raise NotImplementedError(
            "Exercise 5.7 `PagedKVCache.reserve`: not implemented yet — see ch05_kv_cache.ipynb §5.7"
        )

    def fork(self, src: Hashable, dst: Hashable) -> None:
        """``dst`` gets a copy of ``src``'s table and length, sharing every block (incref each)."""
        raise NotImplementedError(
            "Exercise 5.7 `PagedKVCache.fork`: not implemented yet — see ch05_kv_cache.ipynb §5.7"
        )

    def free(self, seq: Hashable) -> None:
        """Drop ``seq``: decref every block in its table, forget its table and length."""
        raise NotImplementedError(
            "Exercise 5.7 `PagedKVCache.free`: not implemented yet — see ch05_kv_cache.ipynb §5.7"
        )

    def write(self, layer: int, seq: Hashable, k: np.ndarray, v: np.ndarray) -> None:
        """Store ``k, v [T, Hkv, D]`` at positions ``lengths[seq] ..`` (reserved before).
        Writing into a block whose ref count is not 1 is a bug: raise ``RuntimeError``."""
        raise NotImplementedError(
            "Exercise 5.7 `PagedKVCache.write`: not implemented yet — see ch05_kv_cache.ipynb §5.7"
        )

    def gather(self, layer: int, seq: Hashable, n_new: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """K and V of positions ``0 .. lengths[seq] + n_new - 1`` as ``[Tk, Hkv, D]``, read through the table."""
        raise NotImplementedError(
            "Exercise 5.7 `PagedKVCache.gather`: not implemented yet — see ch05_kv_cache.ipynb §5.7"
        )

    def advance(self, seq: Hashable, n: int) -> None:
        """``lengths[seq] += n``."""
        raise NotImplementedError(
            "Exercise 5.7 `PagedKVCache.advance`: not implemented yet — see ch05_kv_cache.ipynb §5.7"
        )

    def sequence(self, seq: Hashable) -> PagedSequence:
        """(provided) The cache interface of one sequence, for ``LlamaModel.forward``."""
        return PagedSequence(self, seq)

    @property
    def block_bytes(self) -> int:
        """Bytes of one block: K and V, all layers."""
        raise NotImplementedError(
            "Exercise 5.7 `PagedKVCache.block_bytes`: not implemented yet — see ch05_kv_cache.ipynb §5.7"
        )

    def memory(self) -> dict[str, float]:
        """Accounting: ``blocks_total``, ``blocks_used``, ``blocks_free``, ``bytes_total``,
        ``bytes_used``, ``bytes_free``, and ``fragmentation`` — the share of slots in used
        blocks that hold no token (count a block shared by several sequences once)."""
        raise NotImplementedError(
            "Exercise 5.7 `PagedKVCache.memory`: not implemented yet — see ch05_kv_cache.ipynb §5.7"
        )


def paged_attention(
    q: np.ndarray,
    k_pool: np.ndarray,
    v_pool: np.ndarray,
    block_table: list[int] | np.ndarray,
    seq_len: int,
) -> np.ndarray:
    """Causal attention of ``q [Tq, Hq, D]`` over a sequence stored in one layer's pools
    ``[num_blocks, Hkv, block_size, D]``: gather positions ``0 .. seq_len - 1`` through
    ``block_table`` into ``[seq_len, Hkv, D]`` and attend as usual (use
    ``llmrs_core.attention.scaled_dot_product_attention`` or yours). ``seq_len`` beyond
    the table's blocks raises ``ValueError``."""
    raise NotImplementedError(
        "Exercise 5.7 `paged_attention`: not implemented yet — see ch05_kv_cache.ipynb §5.7"
    )
