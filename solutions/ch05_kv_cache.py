"""Chapter 5 solutions: the engine's KV caches (llmrs_core.kv_cache)."""

from llmrs_core.kv_cache.contiguous import CacheFullError, ContiguousKVCache
from llmrs_core.kv_cache.paged import BlockAllocator, OutOfBlocksError, PagedKVCache, paged_attention

__all__ = [
    "BlockAllocator",
    "CacheFullError",
    "ContiguousKVCache",
    "OutOfBlocksError",
    "PagedKVCache",
    "paged_attention",
]
