"""Exercise 5.6 — Implementing a Contiguous KV Cache.

The reference: the model without any cache (recomputing the whole prefix)
must give the same logits as the model decoding step by step on your cache.
"""

from __future__ import annotations

import numpy as np
import pytest

import llmrs_core as llmrs
from llmrs_core.testing import float32_tolerance, normalised_error, tiny_llama_config, write_tiny_llama

TINY = tiny_llama_config()


@pytest.fixture(scope="module")
def tiny_net(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny") / "tiny.gguf"
    write_tiny_llama(path, seed=3)
    return llmrs.load(path).network


def test_ex5_6_layout_and_size(ex):
    cache = ex.ContiguousKVCache(TINY, max_tokens=10)
    assert cache.k.shape == (2, 2, 10, 8), (
        f"k has shape {cache.k.shape}; the layout is [n_layers, n_kv_heads, max_tokens, head_dim]"
    )
    assert cache.v.shape == cache.k.shape and cache.k.dtype == np.float32
    assert cache.length == 0 and cache.max_tokens == 10
    assert cache.nbytes == 2 * 2 * 2 * 10 * 8 * 4
    with pytest.raises(ValueError):
        ex.ContiguousKVCache(TINY, max_tokens=0)


def test_ex5_6_write_view_advance(ex):
    cache = ex.ContiguousKVCache(TINY, max_tokens=6)
    rng = np.random.default_rng(0)
    k1, v1 = rng.standard_normal((2, 3, 2, 8)).astype(np.float32)  # T=3 tokens
    for layer in range(2):
        cache.write(layer, k1 + layer, v1 - layer)
    assert cache.length == 0, "write must not advance: every layer writes the same positions"
    k, v = cache.view(1, 3)
    assert k.shape == (3, 2, 8), f"view returns [Tk, Hkv, D]; got {k.shape}"
    np.testing.assert_array_equal(k, k1 + 1)
    np.testing.assert_array_equal(v, v1 - 1)
    cache.advance(3)
    k2, v2 = rng.standard_normal((2, 1, 2, 8)).astype(np.float32)
    cache.write(0, k2, v2)
    k, _ = cache.view(0, 1)
    np.testing.assert_array_equal(k, np.concatenate([k1, k2]))
    cache.advance(1)
    assert cache.length == 4
    with pytest.raises(ex.CacheFullError):
        cache.write(0, *rng.standard_normal((2, 3, 2, 8)).astype(np.float32))


def test_ex5_6_the_model_runs_on_your_cache(ex, tiny_net):
    ids = [3, 9, 27, 17, 51, 25, 11, 33]
    full = tiny_net.forward(ids)
    cache = ex.ContiguousKVCache(tiny_net.config, max_tokens=len(ids))
    steps = [tiny_net.forward(ids[:4], cache)] + [tiny_net.forward([t], cache) for t in ids[4:]]
    # one token at a time or all at once: the same sums in other orders (float32_tolerance)
    atol = float32_tolerance(tiny_net.config) * np.abs(full).max()
    np.testing.assert_allclose(np.concatenate(steps), full, rtol=0, atol=atol,
                               err_msg="decoding on your cache must give the no-cache logits")
    assert cache.length == len(ids)


@pytest.mark.model
def test_ex5_6_smollm2_cached_equals_uncached(ex, model_path):
    net = llmrs.load(model_path).network
    ids = llmrs.load(model_path).tokenizer.encode("The quick brown fox jumps over the lazy dog because")
    full = net.forward(ids)
    cache = ex.ContiguousKVCache(net.config, max_tokens=len(ids))
    steps = [net.forward(ids[:3], cache)] + [net.forward([t], cache) for t in ids[3:]]
    err, tolerance = normalised_error(np.concatenate(steps), full), float32_tolerance(net.config)
    assert err <= tolerance, (
        f"cached logits differ from the uncached forward by {err:.3g} of the largest logit (want <= {tolerance:.2g})"
    )
