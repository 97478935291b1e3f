"""Prefix caching with a radix tree, RadixAttention-style (chapter 7).

Many requests share a beginning — a system prompt, few-shot examples, the
earlier turns of a chat. Their KV blocks are identical, so computing them
again is waste. The radix tree remembers the token ids of finished (or
preempted) requests together with the KV blocks that hold their keys and
values; a new request walks the tree with its prompt and reuses the longest
match, block by block.

Granularity is the KV block: an edge holds a run of whole blocks (its token
ids, ``block_size`` per block, and the block ids). Nodes are split at block
boundaries when two prompts part ways inside an edge. The tree holds one
reference on each of its blocks (``BlockAllocator.incref``); a request that
reuses them takes its own. **Locks**: a request pins the path it matched
(``lock``) until it finishes, and eviction only removes unlocked leaves,
least recently used first, returning their blocks to the pool.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..kv_cache.paged import BlockAllocator


@dataclass(eq=False)
class RadixNode:
    """A node: the edge from its parent carries ``tokens`` and their ``blocks``."""

    tokens: tuple[int, ...] = ()
    blocks: list[int] = field(default_factory=list)
    parent: RadixNode | None = None
    children: dict[tuple[int, ...], RadixNode] = field(default_factory=dict)  # first block's ids -> child
    lock_count: int = 0
    last_access: int = 0


class RadixCache:
    """A radix tree over token ids whose edges own KV blocks."""

    def __init__(self, allocator: BlockAllocator, block_size: int):
        self.allocator = allocator
        self.block_size = block_size
        self.root = RadixNode()
        self._clock = itertools.count(1)
        self.lookups = 0
        self.lookup_tokens = 0
        self.hit_tokens = 0

    def _key(self, tokens: Sequence[int], start: int = 0) -> tuple[int, ...]:
        return tuple(tokens[start : start + self.block_size])

    # -- matching ------------------------------------------------------------------

    def match_prefix(self, tokens: Sequence[int], count: bool = True) -> tuple[int, list[int], RadixNode]:
        """Longest cached prefix of ``tokens`` in whole blocks, never all of them.

        Returns ``(n_tokens, blocks, last_node)``. At least the last token is
        always left out, because the request needs its logits: a prefix cache
        saves computation, it cannot supply the next token's distribution.
        """
        limit = (len(tokens) - 1) // self.block_size * self.block_size
        node, matched, blocks = self.root, 0, []
        now = next(self._clock)
        while matched < limit:
            child = node.children.get(self._key(tokens, matched))
            if child is None:
                break
            n_blocks = 0
            for b in range(len(child.blocks)):
                start = matched + b * self.block_size
                if start + self.block_size > limit or tuple(tokens[start : start + self.block_size]) != child.tokens[
                    b * self.block_size : (b + 1) * self.block_size
                ]:
                    break
                n_blocks += 1
            if n_blocks == 0:
                break
            if n_blocks < len(child.blocks):
                child = self._split(child, n_blocks)
            child.last_access = now
            blocks += child.blocks
            matched += n_blocks * self.block_size
            node = child
        if count:
            self.lookups += 1
            self.lookup_tokens += len(tokens)
            self.hit_tokens += matched
        return matched, blocks, node

    def _split(self, node: RadixNode, n_blocks: int) -> RadixNode:
        """Cut ``node``'s edge after ``n_blocks`` blocks; return the new upper node."""
        cut = n_blocks * self.block_size
        upper = RadixNode(node.tokens[:cut], node.blocks[:n_blocks], node.parent, {},
                          node.lock_count, node.last_access)
        node.parent.children[self._key(node.tokens)] = upper
        node.tokens, node.blocks = node.tokens[cut:], node.blocks[n_blocks:]
        node.parent = upper
        upper.children[self._key(node.tokens)] = node
        return upper

    # -- inserting ----------------------------------------------------------------------

    def insert(self, tokens: Sequence[int], blocks: Sequence[int]) -> int:
        """Remember ``tokens`` (their whole blocks) held in ``blocks``; returns blocks newly cached.

        Where the tree already has a prefix, its own blocks are kept and the
        caller's duplicates are left alone (they go back to the pool when
        the caller frees them). New edges take a reference on their blocks.
        """
        n_full = min(len(tokens) // self.block_size, len(blocks))
        tokens = tuple(tokens[: n_full * self.block_size])
        matched, _, node = self.match_prefix(tokens + (-1,), count=False)  # the sentinel lets all match
        if matched == len(tokens):
            return 0
        new_blocks = list(blocks[matched // self.block_size : n_full])
        for b in new_blocks:
            self.allocator.incref(b)
        child = RadixNode(tokens[matched:], new_blocks, node, {}, 0, next(self._clock))
        node.children[self._key(child.tokens)] = child
        return len(new_blocks)

    # -- locks and eviction ---------------------------------------------------------------

    def lock(self, node: RadixNode) -> None:
        """Pin ``node`` and its ancestors: in use by a request, not evictable."""
        while node is not None and node is not self.root:
            node.lock_count += 1
            node = node.parent

    def unlock(self, node: RadixNode) -> None:
        while node is not None and node is not self.root:
            if node.lock_count <= 0:
                raise RuntimeError("unlock without a matching lock")
            node.lock_count -= 1
            node = node.parent

    def _leaves(self) -> list[RadixNode]:
        out, stack = [], [self.root]
        while stack:
            node = stack.pop()
            if not node.children and node is not self.root:
                out.append(node)
            stack.extend(node.children.values())
        return out

    def evict(self, n_blocks: int) -> int:
        """Free up to ``n_blocks`` blocks from unlocked leaves, least recently used first.

        Returns how many blocks went back to the pool (a block also held by a
        running request does not, until that request lets go of it).
        """
        freed = 0
        while freed < n_blocks:
            leaves = [n for n in self._leaves() if n.lock_count == 0]
            if not leaves:
                break
            victim = min(leaves, key=lambda n: n.last_access)
            for b in victim.blocks:
                if self.allocator.ref_counts[b] == 1:
                    freed += 1
                self.allocator.decref(b)
            del victim.parent.children[self._key(victim.tokens)]
        return freed

    def clear(self) -> None:
        """Drop everything unlocked (for tests and shutdown)."""
        self.evict(10**12)

    # -- accounting -------------------------------------------------------------------------

    @property
    def num_blocks(self) -> int:
        total, stack = 0, [self.root]
        while stack:
            node = stack.pop()
            total += len(node.blocks)
            stack.extend(node.children.values())
        return total

    @property
    def hit_rate(self) -> float:
        """Share of looked-up prompt tokens served from the cache."""
        return self.hit_tokens / self.lookup_tokens if self.lookup_tokens else 0.0
