"""Bounded KV caches: sliding window and attention sinks (StreamingLLM)."""

from __future__ import annotations

import numpy as np
import pytest

import llmrs_core as llmrs
from llmrs_core.kv_cache import SinkCache, SlidingWindowCache
from llmrs_core.testing import float32_tolerance, write_tiny_llama


@pytest.fixture(scope="module")
def net(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny") / "tiny.gguf"
    write_tiny_llama(path, seed=9)
    return llmrs.load(path, backend="numpy").network  # the reference ops, swapped in by backend_with


def decode(net, cache, ids):
    return np.concatenate([net.forward([t], cache) for t in ids])


def assert_close(got, want, net):
    """Equal but for float32 sums in other orders (float32_tolerance of the model), relative to the values."""
    np.testing.assert_allclose(got, want, rtol=0, atol=float32_tolerance(net.config) * np.abs(want).max())


def test_before_eviction_both_equal_the_full_cache(net):
    ids = list(range(1, 12))
    full = decode(net, net.new_cache(len(ids)), ids)
    assert_close(decode(net, SlidingWindowCache(net.config, 16), ids), full, net)
    assert_close(decode(net, SinkCache(net.config, 4, 12), ids), full, net)


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
    assert_close(got, want, net)


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
    # decoded one at a time there, prefilled together here: other BLAS paths, same values
    assert_close(cache.v[:, :3], first.v[:, :, :3].transpose(0, 2, 1, 3), net)


def test_bad_budgets(net):
    with pytest.raises(ValueError):
        SinkCache(net.config, n_sink=2, window=0)
    cache = SlidingWindowCache(net.config, 4)
    with pytest.raises(ValueError, match="chunks"):
        net.forward(list(range(1, 10)), cache)
