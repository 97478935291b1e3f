"""Decode tokens of the engine's paged pool, written and attended together (``kv_cache.paged.decode_group``,
``PagedKVCache.reserve_decode``/``write_decode``, ``Backend.paged_decode_attention``).

* the Numba kernel reads the pool in place and gives the numbers of the contiguous kernel on the
  gathered keys, bit for bit (both call ``ops._attend``); the base backend's default is that
  gather and the backend's own attention;
* through a whole model, a sequence decoded in a batch of paged sequences gets the logits it gets
  alone in a contiguous cache (bit for bit on the float paths), also beside a prefill chunk;
* a sequence whose last block is shared (a fork) has it copied before its token is written.
"""

from __future__ import annotations

import numpy as np
import pytest

import llmrs_core as llmrs
from llmrs_core.backends.numpy_backend import NumpyBackend
from llmrs_core.kernels.cpu import ops
from llmrs_core.kv_cache.paged import PagedKVCache, PagedSequence, decode_group
from llmrs_core.testing import write_tiny_llama
from llmrs_core.workbook.checked import CheckedPagedKVCache

pytestmark = pytest.mark.core


def random_pool(rng, n_blocks=12, hkv=2, block_size=4, dim=16):
    k = rng.standard_normal((n_blocks, hkv, block_size, dim)).astype(np.float32)
    v = rng.standard_normal((n_blocks, hkv, block_size, dim)).astype(np.float32)
    return k, v


def gathered(pool, table, length):
    positions = np.arange(length)
    return pool[np.asarray(table)[positions // pool.shape[2]], :, positions % pool.shape[2]]


@pytest.mark.parametrize("seed", range(4))
def test_numba_kernel_equals_the_contiguous_kernel_on_the_gathered_cache(seed):
    rng = np.random.default_rng(seed)
    k_pool, v_pool = random_pool(rng)
    lengths = np.array([1, 4, 5, 11, 3], np.int64)  # one position, a whole block, block edges, most blocks
    tables = np.stack([rng.permutation(12)[:3] for _ in lengths]).astype(np.int64)
    tables[3, 1] = tables[0, 0]  # blocks shared between sequences are read, never written
    q = rng.standard_normal((len(lengths), 6, 16)).astype(np.float32)  # 6 query heads on 2 KV heads
    got = ops.paged_decode_attention(q, k_pool, v_pool, tables, lengths, *ops.NO_OPTIONS)
    for i, length in enumerate(lengths):
        want = ops.attention(q[i:i + 1], np.ascontiguousarray(gathered(k_pool, tables[i], length)),
                             np.ascontiguousarray(gathered(v_pool, tables[i], length)), *ops.NO_OPTIONS)
        np.testing.assert_array_equal(got[i:i + 1], want, f"sequence {i} (length {length}) differs from "
                                      "the contiguous kernel on its gathered keys")
    default = NumpyBackend().paged_decode_attention(q, k_pool, v_pool, tables, lengths)
    np.testing.assert_allclose(default, got, rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("paged") / "tiny.gguf"
    write_tiny_llama(path, weight_type="q4_1", seed=11, hidden_size=64, intermediate_size=128, n_heads=4,
                     n_kv_heads=2)
    return path


def decode_alone(net, prompt, tokens):
    """Each next-token logits of ``prompt`` then ``tokens`` one by one, in a contiguous cache."""
    cache = net.new_cache(len(prompt) + len(tokens))
    out = [net.forward(prompt, cache, last_only=True)[0]]
    for t in tokens:
        out.append(net.forward([t], cache, last_only=True)[0])
    return out


@pytest.mark.parametrize("backend, exact", [("numpy", False), ("numba", True), ("numba", False)])
def test_a_paged_batch_decodes_as_contiguous_caches_do(tiny_path, backend, exact):
    """The same steps, once with the sequences in the paged pool (decoded together) and once in
    contiguous caches (each written and attended on its own): the same rows go through the same
    products, so only the attention path differs, and it must not change a bit."""
    net = llmrs.load(tiny_path, backend=backend, **({"exact": exact} if backend == "numba" else {})).network
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, 64, n).tolist() for n in (3, 9, 4, 17, 8)]  # ends inside and on block edges
    steps = [rng.integers(0, 64, len(prompts)).tolist() for _ in range(6)]
    pool = PagedKVCache(net.config, num_blocks=32, block_size=4, xp=net.backend.xp)
    paged = [pool.sequence(i) for i in range(len(prompts))]
    contiguous = [net.new_cache(len(p) + len(steps)) for p in prompts]
    for caches in (paged, contiguous):
        for p, cache in zip(prompts, caches):
            net.forward(p, cache)
    for step, tokens in enumerate(steps):
        assert decode_group(paged, [1] * len(paged)) == (pool, list(range(len(paged))))
        assert decode_group(contiguous, [1] * len(paged)) is None
        got = net.forward_batch([([t], s) for t, s in zip(tokens, paged)])
        want = net.forward_batch([([t], s) for t, s in zip(tokens, contiguous)])
        for i, (g, w) in enumerate(zip(got, want)):
            np.testing.assert_array_equal(g, w, f"sequence {i}, step {step}: the paged batch's decode differs "
                                          "from the same step on contiguous caches")


def test_decode_tokens_beside_a_prefill_chunk(tiny_path):
    net = llmrs.load(tiny_path, backend="numba", exact=True).network
    rng = np.random.default_rng(1)
    prompt_a, prompt_b = rng.integers(0, 64, 6).tolist(), rng.integers(0, 64, 10).tolist()
    pool = PagedKVCache(net.config, num_blocks=32, block_size=4)
    a, b = pool.sequence("a"), pool.sequence("b")
    ca, cb = net.new_cache(8), net.new_cache(12)
    net.forward(prompt_a, a)
    net.forward(prompt_a, ca)
    assert decode_group([a, b], [1, len(prompt_b)]) == (pool, [0])  # only the decode token joins
    got = net.forward_batch([([7], a), (prompt_b, b)], last_only=False)
    want = net.forward_batch([([7], ca), (prompt_b, cb)], last_only=False)
    for g, w, name in zip(got, want, ("the decode token", "the prefill chunk")):
        np.testing.assert_array_equal(g, w, f"{name} beside the other differs from contiguous caches")
    assert pool.lengths == {"a": 7, "b": 10}


def test_a_forked_sequence_copies_its_shared_block_before_writing(tiny_path):
    net = llmrs.load(tiny_path, backend="numpy").network
    pool = PagedKVCache(net.config, num_blocks=16, block_size=4)
    parent = pool.sequence("parent")
    prompt = [1, 2, 3, 4, 5, 6]  # the second block half full
    net.forward(prompt, parent)
    pool.fork("parent", "child")
    child = PagedSequence(pool, "child")
    shared = pool.tables["parent"][1]
    before = pool.k[:, shared].copy()
    got = net.forward_batch([([9], child), ([8], parent)])
    assert pool.tables["child"][1] != shared, "the child's shared block was not copied before its write"
    np.testing.assert_array_equal(pool.k[:, shared, :, :2], before[:, :, :2])  # the two stored positions
    contiguous = [net.new_cache(8), net.new_cache(8)]
    for cache in contiguous:
        net.forward(prompt, cache)
    want = net.forward_batch([([9], contiguous[0]), ([8], contiguous[1])])
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def test_a_learners_cache_is_not_grouped():
    pool = PagedKVCache.__new__(PagedKVCache)
    pool.tables, pool.lengths = {}, {}
    theirs = CheckedPagedKVCache(pool, yours=True).sequence("x")  # how a learner's pool reaches the engine
    assert decode_group([theirs], [1]) is None, "a learner's cache must go through its own write/view, checked"
    assert decode_group([PagedSequence(pool, "y")], [1]) == (pool, [0])
