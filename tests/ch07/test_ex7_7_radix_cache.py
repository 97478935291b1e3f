"""Exercise 7.7 — Prefix Caching with RadixAttention: against a naive list of cached sequences."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmrs_core.kv_cache.paged import BlockAllocator
from llmrs_core.testing import longest_cached_prefix


def store(tree, alloc, seq):
    """Insert like the engine: the request holds blocks, the tree takes its own references."""
    blocks = [alloc.allocate() for _ in range(len(seq) // tree.block_size)]
    tree.insert(seq, blocks)
    for b in blocks:
        alloc.decref(b)


def test_ex7_7_match_insert_and_split(ex):
    alloc = BlockAllocator(32)
    tree = ex.RadixCache(alloc, 2)
    assert tree.match_prefix([1, 2, 3])[0] == 0, "an empty tree matches nothing"
    store(tree, alloc, [1, 2, 3, 4, 5, 6])
    n, blocks, node = tree.match_prefix([1, 2, 3, 4, 5, 6, 7])
    assert n == 6 and len(blocks) == 3
    assert tree.match_prefix([1, 2, 3, 4, 5, 6])[0] == 4, "never the whole prompt: the last token is computed"
    n, blocks, node = tree.match_prefix([1, 2, 3, 4, 9, 9, 9])
    assert n == 4 and node.tokens[-2:] == (3, 4), "a match ending inside an edge splits it at a block boundary"
    store(tree, alloc, [1, 2, 3, 4, 9, 9])  # shares the first two blocks
    assert tree.num_blocks == 4, "shared blocks are stored once"
    assert tree.match_prefix([1, 2, 3, 4, 9, 9, 0])[0] == 6
    assert tree.match_prefix([1, 2, 3, 4, 5, 6, 0])[0] == 6


def test_ex7_7_hit_rate(ex):
    alloc = BlockAllocator(8)
    tree = ex.RadixCache(alloc, 4)
    assert tree.hit_rate == 0.0
    store(tree, alloc, list(range(8)))
    tree.match_prefix(list(range(10)))  # 8 of 10 tokens
    tree.match_prefix([99] * 10)  # 0 of 10
    assert tree.lookups == 2 and tree.hit_tokens == 8 and tree.hit_rate == pytest.approx(0.4)


def test_ex7_7_locks_and_lru_eviction(ex):
    alloc = BlockAllocator(8)
    tree = ex.RadixCache(alloc, 2)
    for seq in ([1, 2, 3, 4], [1, 2, 5, 6], [7, 8]):
        store(tree, alloc, seq)
    assert alloc.num_used == 4
    tree.match_prefix([7, 8, 0])  # [7, 8] is now the most recently used
    n, _, node = tree.match_prefix([1, 2, 5, 6, 0])
    tree.lock(node)
    assert tree.evict(1) == 1 and alloc.num_used == 3, "the least recently used unlocked leaf goes first: [3, 4]"
    assert tree.match_prefix([1, 2, 3, 4, 0])[0] == 2
    assert tree.evict(10) == 1, "then [7, 8]; the locked path [1,2]+[5,6] stays"
    tree.unlock(node)
    tree.clear()
    assert alloc.num_used == 0 and tree.num_blocks == 0
    with pytest.raises(RuntimeError):
        tree.unlock(node)


def test_ex7_7_blocks_in_use_survive_eviction(ex):
    alloc = BlockAllocator(4)
    tree = ex.RadixCache(alloc, 2)
    blocks = [alloc.allocate(), alloc.allocate()]
    tree.insert([1, 2, 3, 4], blocks)  # a running request still holds them too
    assert [alloc.ref_counts[b] for b in blocks] == [2, 2]
    assert tree.evict(2) == 0, "evicting returns nothing while the request holds the blocks"
    assert [alloc.ref_counts[b] for b in blocks] == [1, 1]


SEQS = st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=16), min_size=1, max_size=10)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(SEQS, st.lists(st.integers(0, 2), min_size=1, max_size=16))
def test_ex7_7_matches_the_naive_longest_prefix(ex, seqs, query):
    bs = 2
    alloc = BlockAllocator(500)
    tree = ex.RadixCache(alloc, bs)
    stored = []
    for s in seqs:
        store(tree, alloc, s)
        stored.append(tuple(s[: len(s) // bs * bs]))
    matched, blocks, _ = tree.match_prefix(query)
    best = longest_cached_prefix(stored, query, bs)
    assert matched == best, f"matched {matched} tokens, the longest cached block prefix is {best}"
    assert len(blocks) == matched // bs
    distinct = tree.num_blocks
    assert alloc.num_used == distinct, "the tree holds exactly its blocks, each once"
    tree.clear()
    assert alloc.num_used == 0
