"""PagedAttention's memory manager: the KV cache as virtual memory (chapter 5).

A contiguous cache reserves ``max_tokens`` for every sequence up front and
wastes whatever the sequence does not use. PagedAttention (vLLM) instead
cuts the cache into a pool of fixed-size **blocks** (``block_size`` tokens
each) and gives each sequence a **block table**: logical block ``i`` of the
sequence lives in physical block ``table[i]``, anywhere in the pool — like
pages and a page table. Blocks are taken on demand, one block boundary at a
time, and at most ``block_size - 1`` slots per sequence are ever idle.

Blocks carry reference counts, so sequences can **share** them: ``fork``
(parallel samples of one prompt, beam search) copies only the table. A
shared block is never written: before a sequence writes into a block that
another also holds, the block is **copied on write**.

Pool layout per layer: ``[num_blocks, n_kv_heads, block_size, head_dim]``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass
from types import ModuleType

import numpy as np

from ..attention import scaled_dot_product_attention
from ..config import ModelConfig
from ..memory import check_host_allocation
from .base import KVCache


def blocks_for(n_tokens: int, block_size: int) -> int:
    """How many blocks of ``block_size`` tokens hold ``n_tokens`` tokens: ``ceil(n_tokens / block_size)``."""
    return -(-n_tokens // block_size)


class OutOfBlocksError(RuntimeError):
    """The pool has too few free blocks for a request; nothing was changed.

    A scheduler catches this to preempt or delay a sequence (chapter 7).
    """

    def __init__(self, needed: int, free: int):
        super().__init__(f"need {needed} free KV-cache block(s), only {free} left")
        self.needed = needed
        self.free = free


class BlockAllocator:
    """Hands out block ids from a fixed pool and counts references to each."""

    def __init__(self, num_blocks: int):
        if num_blocks <= 0:
            raise ValueError(f"num_blocks must be positive, got {num_blocks}")
        self.num_blocks = num_blocks
        self.ref_counts = [0] * num_blocks
        self._free: deque[int] = deque(range(num_blocks))

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free)

    def allocate(self) -> int:
        """A free block with reference count 1; ``OutOfBlocksError`` if none is left."""
        if not self._free:
            raise OutOfBlocksError(1, 0)
        block = self._free.popleft()
        self.ref_counts[block] = 1
        return block

    def incref(self, block: int) -> None:
        if self.ref_counts[block] <= 0:
            raise RuntimeError(f"block {block} is free; it cannot gain a reference")
        self.ref_counts[block] += 1

    def decref(self, block: int) -> None:
        """Drop one reference; the block returns to the free list when none are left."""
        if self.ref_counts[block] <= 0:
            raise RuntimeError(f"block {block} is already free (double free)")
        self.ref_counts[block] -= 1
        if self.ref_counts[block] == 0:
            self._free.append(block)


class PagedKVCache:
    """K and V for many sequences in one pool of blocks.

    ``k[layer]`` is ``[num_blocks, n_kv_heads, block_size, head_dim]``.
    Per sequence: ``tables[seq]`` (physical block ids) and ``lengths[seq]``
    (tokens stored). Use :meth:`sequence` to get the view the model's forward
    pass writes through. ``xp`` is the array module of the pool (the backend's).
    """

    def __init__(
        self, config: ModelConfig, num_blocks: int, block_size: int = 16, dtype: type = np.float32,
        xp: ModuleType = np,
    ):
        if block_size <= 0:
            raise ValueError(f"block_size must be positive, got {block_size}")
        self.config = config
        self.block_size = block_size
        shape = (config.n_layers, num_blocks, config.n_kv_heads, block_size, config.head_dim)
        if xp is np:  # before any per-block structure; a GPU backend's xp checks its own memory
            pool = 2 * int(np.prod(shape, dtype=np.float64)) * np.dtype(dtype).itemsize
            check_host_allocation(pool, f"a KV pool of {num_blocks:,} blocks of {block_size} tokens")
        self.allocator = BlockAllocator(num_blocks)
        self.k = xp.zeros(shape, dtype=dtype)
        self.v = xp.zeros(shape, dtype=dtype)
        self.tables: dict[Hashable, list[int]] = {}
        self.lengths: dict[Hashable, int] = {}

    # -- sequences -----------------------------------------------------------

    def add_sequence(self, seq: Hashable) -> None:
        if seq in self.tables:
            raise ValueError(f"sequence {seq!r} already exists")
        self.tables[seq] = []
        self.lengths[seq] = 0

    def _blocks_needed(self, seq: Hashable, n: int) -> tuple[int, bool]:
        """(new blocks for ``n`` more tokens, whether the last block must be copied first)."""
        length, table = self.lengths[seq], self.tables[seq]
        capacity = len(table) * self.block_size
        new = max(0, blocks_for(length + n - capacity, self.block_size))
        partial = length % self.block_size != 0
        cow = n > 0 and partial and self.allocator.ref_counts[table[-1]] > 1
        return new, cow

    def can_append(self, seq: Hashable, n: int) -> bool:
        new, cow = self._blocks_needed(seq, n)
        return new + cow <= self.allocator.num_free

    def reserve(self, seq: Hashable, n: int) -> None:
        """Make room for ``n`` more tokens of ``seq``: blocks on boundaries, copy-on-write.

        All or nothing: on ``OutOfBlocksError`` the cache is unchanged.
        """
        if seq not in self.tables:
            raise KeyError(f"unknown sequence {seq!r}")
        new, cow = self._blocks_needed(seq, n)
        if new + cow > self.allocator.num_free:
            raise OutOfBlocksError(new + cow, self.allocator.num_free)
        table = self.tables[seq]
        if cow:
            old = table[-1]
            fresh = self.allocator.allocate()
            self.k[:, fresh] = self.k[:, old]
            self.v[:, fresh] = self.v[:, old]
            self.allocator.decref(old)
            table[-1] = fresh
        for _ in range(new):
            table.append(self.allocator.allocate())

    def fork(self, src: Hashable, dst: Hashable) -> None:
        """``dst`` starts as a copy of ``src`` that shares all of its blocks."""
        if dst in self.tables:
            raise ValueError(f"sequence {dst!r} already exists")
        for block in self.tables[src]:
            self.allocator.incref(block)
        self.tables[dst] = list(self.tables[src])
        self.lengths[dst] = self.lengths[src]

    def free(self, seq: Hashable) -> None:
        """Release every block of ``seq`` (shared blocks stay while others hold them)."""
        for block in self.tables.pop(seq):
            self.allocator.decref(block)
        del self.lengths[seq]

    # -- data ------------------------------------------------------------------

    def _slots(self, seq: Hashable, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        positions = np.arange(start, stop)
        table = np.asarray(self.tables[seq], dtype=np.int64)
        return table[positions // self.block_size], positions % self.block_size

    def write(self, layer: int, seq: Hashable, k: np.ndarray, v: np.ndarray) -> None:
        """Store ``k, v [T, Hkv, D]`` at the next ``T`` positions of ``seq`` (after :meth:`reserve`)."""
        start = self.lengths[seq]
        stop = start + k.shape[0]
        if stop > len(self.tables[seq]) * self.block_size:
            raise RuntimeError(f"sequence {seq!r}: reserve({k.shape[0]}) before writing")
        blocks, offsets = self._slots(seq, start, stop)
        for b in np.unique(blocks):
            if self.allocator.ref_counts[b] != 1:  # an invariant, not a user error
                raise RuntimeError(f"block {b} is shared by {self.allocator.ref_counts[b]} sequences; not writable")
        self.k[layer, blocks, :, offsets] = k
        self.v[layer, blocks, :, offsets] = v

    def gather(self, layer: int, seq: Hashable, n_new: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """All stored K and V of ``seq`` (plus ``n_new`` just written) as ``[L, Hkv, D]``."""
        blocks, offsets = self._slots(seq, 0, self.lengths[seq] + n_new)
        return self.k[layer, blocks, :, offsets], self.v[layer, blocks, :, offsets]

    def advance(self, seq: Hashable, n: int) -> None:
        self.lengths[seq] += n

    def sequence(self, seq: Hashable) -> PagedSequence:
        """The cache interface of one sequence, for ``LlamaModel.forward``."""
        return PagedSequence(self, seq)

    # -- the engine's batched decode (beyond Exercise 5.7's API, which is a subset of this class's) --

    def reserve_decode(self, seqs: list[Hashable]) -> DecodeSlots:
        """Room for one more token of each of ``seqs`` (:meth:`reserve`), and where it goes: the
        step's :class:`DecodeSlots`, for :meth:`write_decode` and a backend's
        ``paged_decode_attention``. Lengths move on only with :meth:`advance`."""
        for seq in seqs:
            self.reserve(seq, 1)
        lengths = np.array([self.lengths[seq] for seq in seqs], dtype=np.int64)
        tables = np.zeros((len(seqs), max(len(self.tables[seq]) for seq in seqs)), dtype=np.int64)
        for i, seq in enumerate(seqs):
            tables[i, : len(self.tables[seq])] = self.tables[seq]
        blocks = tables[np.arange(len(seqs)), lengths // self.block_size]
        counts = self.allocator.ref_counts
        shared = [int(b) for b in blocks if counts[b] != 1]
        if shared:  # an invariant (reserve copies a shared block first), not a user error
            raise RuntimeError(f"block {shared[0]} is shared by {counts[shared[0]]} sequences; not writable")
        return DecodeSlots(tables, lengths + 1, blocks, lengths % self.block_size)

    def write_decode(self, layer: int, slots: DecodeSlots, k: np.ndarray, v: np.ndarray) -> None:
        """Store each sequence's new token, ``k, v [n, Hkv, D]``, at its slot (after :meth:`reserve_decode`)."""
        self.k[layer, slots.blocks, :, slots.offsets] = k
        self.v[layer, slots.blocks, :, slots.offsets] = v

    # -- accounting --------------------------------------------------------------

    @property
    def block_bytes(self) -> int:
        """Bytes of one block: K and V, every layer."""
        return 2 * self.k[:, 0].nbytes

    def memory(self) -> dict[str, float]:
        """Bytes in use and free, and internal fragmentation (idle slots in used blocks).

        Shared blocks are counted once: that is the point of sharing.
        """
        used = self.allocator.num_used
        distinct = {b for table in self.tables.values() for b in table}
        slots_filled = 0
        for seq, table in self.tables.items():
            for i, b in enumerate(table):
                if b in distinct:
                    slots_filled += min(self.block_size, max(0, self.lengths[seq] - i * self.block_size))
                    distinct.discard(b)
        capacity = used * self.block_size
        return {
            "blocks_total": self.allocator.num_blocks,
            "blocks_used": used,
            "blocks_free": self.allocator.num_free,
            "bytes_total": self.allocator.num_blocks * self.block_bytes,
            "bytes_used": used * self.block_bytes,
            "bytes_free": self.allocator.num_free * self.block_bytes,
            "fragmentation": 1 - slots_filled / capacity if capacity else 0.0,
        }


@dataclass(frozen=True)
class DecodeSlots:
    """One decode step of ``n`` sequences of a :class:`PagedKVCache`: ``tables`` int64
    ``[n, max blocks]`` (each sequence's block table, padded with zeros), ``lengths`` ``[n]``
    (positions attended, the new token's included), and the new token's ``blocks`` and
    ``offsets`` ``[n]``."""

    tables: np.ndarray
    lengths: np.ndarray
    blocks: np.ndarray
    offsets: np.ndarray


def decode_group(caches: list[KVCache], sizes: list[int]) -> tuple[PagedKVCache, list[int]] | None:
    """The sequences of a step that can decode together: ``(pool, their indices)`` for those
    with one new token that are a :class:`PagedSequence` of a :class:`PagedKVCache` (the first such
    pool's), or None where there are none. A learner's cache (Exercises 5.6, 5.7) comes wrapped in
    the workbook's checks, and goes through its own ``write``/``view`` instead."""
    pool, members = None, []
    for j, (cache, t) in enumerate(zip(caches, sizes)):
        if t != 1 or not isinstance(cache, PagedSequence) or not isinstance(cache.cache, PagedKVCache):
            continue
        if pool is None:
            pool = cache.cache
        if cache.cache is pool:
            members.append(j)
    return (pool, members) if pool is not None else None


class PagedSequence(KVCache):
    """One sequence of a :class:`PagedKVCache`, as a :class:`~llmrs_core.kv_cache.base.KVCache`.

    ``LlamaModel.forward(ids, cache=paged.sequence(seq))`` runs unchanged;
    :meth:`reserve` makes room for the new tokens before the first layer writes.
    """

    def __init__(self, cache: PagedKVCache, seq: Hashable):
        if seq not in cache.tables:
            cache.add_sequence(seq)
        self.cache = cache
        self.seq = seq
        self._reserved_for = -1

    @property
    def length(self) -> int:
        return self.cache.lengths[self.seq]

    def write(self, layer: int, k: np.ndarray, v: np.ndarray) -> None:
        if layer == 0 or self._reserved_for != self.length:
            self.reserve(k.shape[0])
            self._reserved_for = self.length
        self.cache.write(layer, self.seq, k, v)

    def reserve(self, n: int) -> None:
        """Room in the pool for ``n`` new tokens (the pool's ``reserve``: blocks, copy-on-write)."""
        self.cache.reserve(self.seq, n)

    def view(self, layer: int, n_new: int) -> tuple[np.ndarray, np.ndarray]:
        return self.cache.gather(layer, self.seq, n_new)

    def advance(self, n_new: int) -> None:
        self.cache.advance(self.seq, n_new)
        self._reserved_for = -1


def paged_attention(
    q: np.ndarray,
    k_pool: np.ndarray,
    v_pool: np.ndarray,
    block_table: list[int] | np.ndarray,
    seq_len: int,
) -> np.ndarray:
    """Causal attention of ``q [Tq, Hq, D]`` over a sequence stored in blocks.

    ``k_pool, v_pool`` are one layer's pools ``[num_blocks, Hkv, block_size, D]``;
    the sequence's first ``seq_len`` positions are gathered through
    ``block_table`` (position ``p`` is slot ``p % block_size`` of block
    ``block_table[p // block_size]``) and attended like a contiguous cache.
    """
    block_size = k_pool.shape[2]
    if seq_len > len(block_table) * block_size:
        raise ValueError(f"seq_len {seq_len} exceeds the {len(block_table)} blocks of the table")
    positions = np.arange(seq_len)
    blocks = np.asarray(block_table, dtype=np.int64)[positions // block_size]
    offsets = positions % block_size
    k = k_pool[blocks, :, offsets]  # [seq_len, Hkv, D]
    v = v_pool[blocks, :, offsets]
    return scaled_dot_product_attention(q, k, v, causal=True)
