"""Exercise 7.7 — Prefix Caching with RadixAttention: against a naive list of cached sequences.

The audit, one test per likely mistake: a match one block too short, or one that
takes the whole prompt (its last token must be computed); a match ending inside
an edge that is not split; insert without its own references (``incref``);
eviction in the wrong order, or counting blocks a request still holds as freed;
insert's own walk counted as a lookup.
"""

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


def test_ex7_7_an_empty_tree_matches_nothing(ex):
    tree = ex.RadixCache(BlockAllocator(8), 2)
    n, blocks, node = tree.match_prefix([1, 2, 3])
    assert (n, list(blocks)) == (0, []), f"an empty tree matches nothing; yours matched {n} tokens, blocks {blocks}"
    assert node is tree.root, "with nothing matched, the node is the root"


def test_ex7_7_match_leaves_the_last_token_out(ex):
    alloc = BlockAllocator(32)
    tree = ex.RadixCache(alloc, 2)
    store(tree, alloc, [1, 2, 3, 4, 5, 6])
    n, blocks, _ = tree.match_prefix([1, 2, 3, 4, 5, 6, 7])
    assert n != 4, (
        "7 tokens whose first 6 are cached: yours matched 4, one block too few — the limit is "
        "(len(tokens) - 1) // block_size = 3 blocks, not len(tokens) // block_size - 1"
    )
    assert n == 6 and len(blocks) == 3, f"7 tokens whose first 6 are cached: match 6 in 3 blocks; yours {n} in {len(blocks)}"
    n, _, _ = tree.match_prefix([1, 2, 3, 4, 5, 6])
    assert n != 6, (
        "yours matched all 6 tokens of a 6-token prompt: never the whole prompt — its last token must be computed "
        "for its logits, so at most (6 - 1) // 2 = 2 blocks"
    )
    assert n == 4, f"a 6-token prompt, all cached: match 4 tokens (2 blocks of 2); yours {n}"


def test_ex7_7_a_match_inside_an_edge_splits_it(ex):
    alloc = BlockAllocator(32)
    tree = ex.RadixCache(alloc, 2)
    store(tree, alloc, [1, 2, 3, 4, 5, 6])  # one edge of 3 blocks
    n, blocks, node = tree.match_prefix([1, 2, 3, 4, 9, 9, 9])
    assert n == 4 and len(blocks) == 2, (
        f"[1, 2, 3, 4] of the edge match: 4 tokens in 2 blocks; yours {n} in {len(blocks)} — a match ending inside "
        "an edge splits it at a block boundary, and only the matched blocks are returned"
    )
    assert tuple(node.tokens[-2:]) == (3, 4) and len(node.blocks) == 2, (
        "a match ending inside an edge splits it at a block boundary and returns the upper part: "
        f"yours returned a node with tokens {tuple(node.tokens)}"
    )


def test_ex7_7_a_shared_prefix_is_stored_once(ex):
    alloc = BlockAllocator(32)
    tree = ex.RadixCache(alloc, 2)
    store(tree, alloc, [1, 2, 3, 4, 5, 6])
    store(tree, alloc, [1, 2, 3, 4, 9, 9])  # shares the first two blocks
    assert tree.num_blocks == 4, f"3 blocks, then 1 more for [9, 9]: the shared 2 are stored once; the tree holds {tree.num_blocks}"
    assert tree.match_prefix([1, 2, 3, 4, 9, 9, 0])[0] == 6
    assert tree.match_prefix([1, 2, 3, 4, 5, 6, 0])[0] == 6


def test_ex7_7_insert_takes_its_own_references(ex):
    alloc = BlockAllocator(4)
    tree = ex.RadixCache(alloc, 2)
    blocks = [alloc.allocate(), alloc.allocate()]
    assert tree.insert([1, 2, 3, 4], blocks) == 2, "two blocks newly cached"
    counts = [alloc.ref_counts[b] for b in blocks]
    assert counts == [2, 2], (
        f"after insert the blocks' reference counts are {counts}; expected [2, 2]: the request holds one, the tree "
        "must take its own (allocator.incref), or the blocks go back to the pool when the request ends"
    )


def test_ex7_7_hit_rate(ex):
    alloc = BlockAllocator(8)
    tree = ex.RadixCache(alloc, 4)
    assert tree.hit_rate == 0.0
    store(tree, alloc, list(range(8)))
    tree.match_prefix(list(range(10)))  # 8 of 10 tokens
    tree.match_prefix([99] * 10)  # 0 of 10
    assert tree.lookups == 2, (
        f"two lookups, but lookups is {tree.lookups}: count only match_prefix calls with count=True — insert's own "
        "walk down the tree (count=False) is not a lookup"
    )
    assert (tree.lookup_tokens, tree.hit_tokens) == (20, 8), (
        f"lookup_tokens {tree.lookup_tokens}, hit_tokens {tree.hit_tokens}; expected 20 looked up (10 + 10), 8 hit"
    )
    assert tree.hit_rate == pytest.approx(0.4), f"hit_rate is hit_tokens / lookup_tokens = 8 / 20; yours {tree.hit_rate}"


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
    assert tree.match_prefix([1, 2, 3, 4, 0])[0] == 2, (
        "evict(1) should have removed [3, 4], the least recently used unlocked leaf ([7, 8] was matched after it, "
        "[5, 6] is locked): pick the leaf with the smallest last_access"
    )
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
    freed = tree.evict(2)
    assert freed == 0, (
        f"evict returned {freed}, but a running request still holds both blocks: only a block whose reference count "
        "was 1 goes back to the pool"
    )
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
