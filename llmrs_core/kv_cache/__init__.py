"""The KV cache (chapter 5): keys and values kept so each new token attends without recomputing.

    contiguous   one preallocated run of positions per sequence (chapter 4's cache)
    paged        PagedAttention: a pool of fixed-size blocks, block tables, fork / copy-on-write
    eviction     what to keep when a context outgrows its budget: sliding window, attention sinks
    base         the KVCache interface all of them give the model's forward pass
"""

from .base import KVCache
from .contiguous import CacheFullError, ContiguousKVCache
from .eviction import SinkCache, SlidingWindowCache
from .paged import BlockAllocator, OutOfBlocksError, PagedKVCache, PagedSequence, blocks_for, paged_attention

__all__ = [
    "BlockAllocator",
    "CacheFullError",
    "ContiguousKVCache",
    "KVCache",
    "OutOfBlocksError",
    "PagedKVCache",
    "PagedSequence",
    "SinkCache",
    "SlidingWindowCache",
    "blocks_for",
    "paged_attention",
]
