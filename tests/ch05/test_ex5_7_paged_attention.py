"""Exercise 5.7 — Implementing PagedAttention.

References: the contiguous cache and plain attention (the paged versions must
give the same numbers), and the allocator's invariants, checked by hypothesis
on random sequences of append / fork / free.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import llmrs_core as llmrs
from llmrs_core.attention import scaled_dot_product_attention
from llmrs_core.testing import float32_tolerance, tiny_llama_config, write_tiny_llama

TINY = tiny_llama_config()


@pytest.fixture(scope="module")
def tiny_net(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny") / "tiny.gguf"
    write_tiny_llama(path, seed=4)
    return llmrs.load(path).network


def fill(cache, seq, n, value):
    """Append n tokens to seq whose K and V are all `value` (one reserve, every layer)."""
    cache.reserve(seq, n)
    kv = np.full((n, TINY.n_kv_heads, TINY.head_dim), value, dtype=np.float32)
    for layer in range(TINY.n_layers):
        cache.write(layer, seq, kv, kv)
    cache.advance(seq, n)


# -- the allocator ---------------------------------------------------------------------


def test_ex5_7_allocator(ex):
    a = ex.BlockAllocator(3)
    assert (a.num_free, a.num_used) == (3, 0)
    blocks = [a.allocate() for _ in range(3)]
    assert sorted(blocks) == [0, 1, 2] and a.num_free == 0
    with pytest.raises(ex.OutOfBlocksError):
        a.allocate()
    a.incref(blocks[0])
    a.decref(blocks[0])
    assert a.num_free == 0, "a block with another holder stays in use"
    a.decref(blocks[0])
    assert a.num_free == 1 and a.ref_counts[blocks[0]] == 0
    with pytest.raises(RuntimeError):
        a.decref(blocks[0])  # double free
    with pytest.raises(RuntimeError):
        a.incref(blocks[0])  # reviving a free block
    assert issubclass(ex.OutOfBlocksError, RuntimeError)


# -- block tables ----------------------------------------------------------------------


def test_ex5_7_blocks_are_taken_on_block_boundaries(ex):
    cache = ex.PagedKVCache(TINY, num_blocks=8, block_size=4)
    cache.add_sequence("a")
    for n, blocks in [(1, 1), (3, 1), (1, 2), (3, 2), (1, 3)]:
        fill(cache, "a", n, 1.0)
        assert len(cache.tables["a"]) == blocks, (
            f"after {cache.lengths['a']} tokens with block_size 4 the table should hold {blocks} blocks"
        )
    assert cache.allocator.num_used == 3
    with pytest.raises(ValueError):
        cache.add_sequence("a")


def test_ex5_7_running_out_is_a_clean_typed_error(ex):
    cache = ex.PagedKVCache(TINY, num_blocks=2, block_size=4)
    cache.add_sequence("a")
    fill(cache, "a", 6, 1.0)
    assert not cache.can_append("a", 3)
    before = (list(cache.tables["a"]), cache.lengths["a"], cache.allocator.num_free)
    with pytest.raises(ex.OutOfBlocksError) as e:
        cache.reserve("a", 3)
    assert (list(cache.tables["a"]), cache.lengths["a"], cache.allocator.num_free) == before, (
        "a failed reserve must leave the cache unchanged"
    )
    assert e.value.needed == 1 and e.value.free == 0
    assert cache.can_append("a", 2)


def test_ex5_7_fork_shares_and_copies_on_write(ex):
    cache = ex.PagedKVCache(TINY, num_blocks=8, block_size=4)
    cache.add_sequence("parent")
    fill(cache, "parent", 6, 1.0)  # blocks: full + half full
    cache.fork("parent", "child")
    assert cache.tables["child"] == cache.tables["parent"], "a fork shares the blocks"
    assert all(cache.allocator.ref_counts[b] == 2 for b in cache.tables["parent"])
    used = cache.allocator.num_used
    fill(cache, "child", 1, 2.0)  # writes into the shared, half-full block
    assert cache.tables["child"][0] == cache.tables["parent"][0], "full blocks stay shared"
    assert cache.tables["child"][1] != cache.tables["parent"][1], "the partial block must be copied"
    assert cache.allocator.num_used == used + 1
    k_parent, _ = cache.gather(0, "parent")
    k_child, _ = cache.gather(0, "child")
    assert np.all(k_parent == 1.0), "the parent's keys must not change when the child writes"
    assert np.all(k_child[:6] == 1.0) and np.all(k_child[6] == 2.0), "the child keeps the shared prefix"
    cache.free("parent")
    assert cache.allocator.ref_counts[cache.tables["child"][0]] == 1, "free drops only parent's references"
    cache.free("child")
    assert cache.allocator.num_free == 8


def test_ex5_7_paged_attention_equals_contiguous(ex):
    rng = np.random.default_rng(1)
    block_size, n_blocks, hkv, d = 4, 12, 3, 16
    k_pool = rng.standard_normal((n_blocks, hkv, block_size, d)).astype(np.float32)
    v_pool = rng.standard_normal((n_blocks, hkv, block_size, d)).astype(np.float32)
    table = [7, 2, 10, 5]  # scattered physical blocks
    seq_len = 14
    k = np.concatenate([k_pool[b].transpose(1, 0, 2) for b in table])[:seq_len]
    v = np.concatenate([v_pool[b].transpose(1, 0, 2) for b in table])[:seq_len]
    for tq in (1, 3):
        q = rng.standard_normal((tq, 9, d)).astype(np.float32)
        got = ex.paged_attention(q, k_pool, v_pool, table, seq_len)
        want = scaled_dot_product_attention(q, k, v)
        # sums of d = 16 products (scores of order 1) and of seq_len weighted values
        atol = float32_tolerance(max(d, seq_len)) * np.abs(want).max()
        np.testing.assert_allclose(got, want, rtol=0, atol=atol)
    with pytest.raises(ValueError):
        ex.paged_attention(q, k_pool, v_pool, table, 17)


def test_ex5_7_the_model_runs_on_paged_sequences(ex, tiny_net):
    cache = ex.PagedKVCache(tiny_net.config, num_blocks=16, block_size=4)
    prompts = {"a": [1, 2, 3, 4, 5, 6], "b": [9, 8, 7]}
    outs = {s: [tiny_net.forward(p, cache.sequence(s))] for s, p in prompts.items()}
    for step in range(5):  # interleave the two sequences, one token at a time
        for s in prompts:
            outs[s].append(tiny_net.forward([10 + step], cache.sequence(s)))
    for s, p in prompts.items():
        want = tiny_net.forward(p + [10 + i for i in range(5)])
        atol = float32_tolerance(tiny_net.config) * np.abs(want).max()  # same sums, other orders
        np.testing.assert_allclose(np.concatenate(outs[s]), want, rtol=0, atol=atol,
                                   err_msg=f"sequence {s}: paged decoding must equal the full forward")


def test_ex5_7_memory_accounting(ex):
    cache = ex.PagedKVCache(TINY, num_blocks=10, block_size=4)
    assert cache.block_bytes == 2 * TINY.n_layers * TINY.n_kv_heads * 4 * TINY.head_dim * 4
    cache.add_sequence("a")
    fill(cache, "a", 6, 1.0)  # 2 blocks, 6 of 8 slots
    cache.fork("a", "b")  # shared: still 2 blocks
    m = cache.memory()
    assert (m["blocks_used"], m["blocks_free"], m["blocks_total"]) == (2, 8, 10)
    assert m["bytes_used"] == 2 * cache.block_bytes and m["bytes_total"] == 10 * cache.block_bytes
    assert m["fragmentation"] == pytest.approx(2 / 8), "2 idle slots of 8, shared blocks counted once"


# -- invariants under random operations --------------------------------------------------

OPS = st.lists(
    st.tuples(st.sampled_from(["append", "fork", "free"]), st.integers(0, 3), st.integers(1, 6)),
    min_size=1, max_size=40,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(OPS)
def test_ex5_7_invariants_hold_under_random_operations(ex, ops):
    cache = ex.PagedKVCache(TINY, num_blocks=12, block_size=4)
    expected: dict[int, list[float]] = {}  # what each sequence's keys must read back as
    next_value = 1.0
    for op, who, n in ops:
        live = sorted(expected)
        if op == "append" or not live:
            seq = who if op == "append" else len(expected) + 100
            if seq not in expected:
                cache.add_sequence(seq)
                expected[seq] = []
            try:
                fill(cache, seq, n, next_value)
            except ex.OutOfBlocksError:
                pass  # all or nothing: the expectation stays as it was
            else:
                expected[seq] += [next_value] * n
            next_value += 1
        elif op == "fork":
            src = live[who % len(live)]
            dst = max(expected) + 1
            cache.fork(src, dst)
            expected[dst] = list(expected[src])
        else:
            seq = live[who % len(live)]
            cache.free(seq)
            del expected[seq]
        # invariants
        alloc = cache.allocator
        assert alloc.num_free + alloc.num_used == 12
        holders = [0] * 12
        for table in cache.tables.values():
            for b in table:
                holders[b] += 1
        assert list(alloc.ref_counts) == holders, "every ref count equals the number of tables holding it"
        for seq, values in expected.items():
            k, _ = cache.gather(0, seq)
            assert k[:, 0, 0].tolist() == values, f"sequence {seq} reads back wrong keys: a shared block was written"
    for seq in list(expected):
        cache.free(seq)
    assert cache.allocator.num_free == 12, "every block returns when every sequence is freed"
