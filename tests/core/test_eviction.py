"""Bounded KV caches: sliding window and attention sinks (StreamingLLM)."""

from __future__ import annotations

import numpy as np
import pytest

import llmrs_core as llmrs
from llmrs_core.kv_cache import SinkCache, SlidingWindowCache
from llmrs_core.testing import write_tiny_llama


@pytest.fixture(scope="module")
def net(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny") / "tiny.gguf"
    write_tiny_llama(path, seed=9)
    return llmrs.load(path, backend="numpy").network  # the reference ops, swapped in by backend_with


def decode(net, cache, ids):
    return np.concatenate([net.forward([t], cache) for t in ids])


def test_before_eviction_both_equal_the_full_cache(net):
    ids = list(range(1, 12))
    full = decode(net, net.new_cache(len(ids)), ids)
    np.testing.assert_allclose(decode(net, SlidingWindowCache(net.config, 16), ids), full, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(decode(net, SinkCache(net.config, 4, 12), ids), full, rtol=1e-5, atol=1e-5)


def test_sliding_window_equals_attention_over_the_last_tokens(net):
    """With absolute positions, a window of W is exactly attention restricted to the W cached
    keys plus the new token's own."""
    ids = list(range(1, 30))
    window = 8
    cache = SlidingWindowCache(net.config, window)
    got = decode(net, cache, ids)
    assert cache.kept == window and cache.evicted == len(ids) - window
    full = net.new_cache(len(ids))
    # reference: a full cache, but attention sees only the last window + 1 keys
    from llmrs_core.testing import backend_with

    base = net.backend
    net.backend = backend_with(attention=lambda q, k, v: base.attention(q, k[-window - 1 :], v[-window - 1 :]))
    try:
        want = decode(net, full, ids)
    finally:
        net.backend = base
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_sink_cache_keeps_the_first_tokens_and_counts_positions_in_the_cache(net):
    cache = SinkCache(net.config, n_sink=3, window=5)
    ids = list(range(1, 21))
    decode(net, cache, ids)
    assert cache.kept == 8 and cache.length == 20 and cache.evicted == 12
    assert cache.positions(1).tolist() == [8], "the next query sits at its index in the cache"
    assert cache.key_positions(1).tolist() == list(range(9))
    # the sinks are the first three tokens' values, still in place
    first = net.new_cache(3)
    net.forward(ids[:3], first)
    np.testing.assert_allclose(cache.v[:, :3], first.v[:, :, :3].transpose(0, 2, 1, 3), rtol=1e-5, atol=1e-6)


def test_bad_budgets(net):
    with pytest.raises(ValueError):
        SinkCache(net.config, n_sink=2, window=0)
    cache = SlidingWindowCache(net.config, 4)
    with pytest.raises(ValueError, match="chunks"):
        net.forward(list(range(1, 10)), cache)
