"""Exercise 5.6 — Implementing a Contiguous KV Cache.

The reference: the model without any cache (recomputing the whole prefix)
must give the same logits as the model decoding step by step on your cache;
before that, the engine's own cache's behaviour, one method at a time. The
audit, one test per likely mistake: write that advances ``length``; a view
without the ``n_new`` just written (off by one block of tokens); a write that
ignores ``length`` (always at position 0) or ``layer``; a capacity check off by
one; ``nbytes`` of the keys alone.
"""

from __future__ import annotations

import numpy as np
import pytest

import llmrs_core as llmrs
from llmrs_core.testing import (
    assert_matches,
    float32_tolerance,
    normalised_error,
    tiny_llama_config,
    write_tiny_llama,
)
from llmrs_core.workbook.checked import CheckedKVCache

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
    with pytest.raises(ValueError):
        ex.ContiguousKVCache(TINY, max_tokens=0)


def test_ex5_6_nbytes_counts_keys_and_values(ex):
    cache = ex.ContiguousKVCache(TINY, max_tokens=10)
    one = 2 * 2 * 10 * 8 * 4  # [L, Hkv, max_tokens, D] float32
    assert cache.nbytes != one, f"nbytes is {cache.nbytes}, the bytes of k alone: count v too ({2 * one})"
    assert cache.nbytes == 2 * one, f"nbytes is {cache.nbytes}; k and v take {one} bytes each, {2 * one} together"


def kv(rng, t):
    """Keys and values of ``t`` new tokens, ``[T, Hkv, D]`` float32."""
    return rng.standard_normal((2, t, 2, 8)).astype(np.float32)


def written(ex, t=3):
    """A cache of 6 with ``t`` tokens written in both layers (layer 1's shifted), not yet advanced."""
    cache = ex.ContiguousKVCache(TINY, max_tokens=6)
    k1, v1 = kv(np.random.default_rng(0), t)
    for layer in range(2):
        cache.write(layer, k1 + layer, v1 - layer)
    return cache, k1, v1


def test_ex5_6_write_does_not_advance(ex):
    cache, _, _ = written(ex)
    assert cache.length == 0, (
        f"after both layers wrote 3 tokens, length is {cache.length}: write must not advance — every layer writes "
        "the same positions, and only advance() moves length on"
    )


AXES = ("position", "kv head", "dim")


def test_ex5_6_view_includes_the_new_tokens(ex):
    cache, _, _ = written(ex)
    k, v = cache.view(1, 3)
    shape = getattr(k, "shape", None)
    assert shape != (0, 2, 8), (
        "view(layer, n_new=3) right after writing 3 tokens returned 0 positions: the view covers positions "
        "0 .. length + n_new - 1, so the tokens just written attend to themselves"
    )
    assert shape == (3, 2, 8) and getattr(v, "shape", None) == shape, (
        f"view returns keys and values [Tk, Hkv, D] = (3, 2, 8) here; got {shape}"
        + (" — the storage layout [Hkv, Tk, D]: transpose(1, 0, 2)" if shape == (2, 3, 8) else "")
    )


def test_ex5_6_view_returns_what_was_written(ex):
    cache, k1, v1 = written(ex)
    keys, values = [k1, k1 + 1], [v1, v1 - 1]  # what layers 0 and 1 wrote
    for layer in (0, 1):
        k, v = cache.view(layer, 3)
        other = "of the other layer: write or view ignores `layer`"
        assert_matches(k, keys[layer], [(other, keys[1 - layer])], what=f"view({layer}, 3)'s keys", axes=AXES, tol=0.0)
        assert_matches(v, values[layer], [(other, values[1 - layer])], what=f"view({layer}, 3)'s values", axes=AXES,
                       tol=0.0)


def test_ex5_6_write_goes_after_the_cached_tokens(ex):
    cache, k1, _ = written(ex)
    cache.advance(3)
    k2, v2 = kv(np.random.default_rng(1), 1)
    cache.write(0, k2, v2)
    k, _ = cache.view(0, 1)
    at_zero = np.concatenate([k2, k1[1:], np.zeros_like(k2)])
    assert_matches(k, np.concatenate([k1, k2]), [("with the new token written at position 0 instead of at length",
                   at_zero)], what="after advance(3) and a 1-token write, view(0, 1)'s keys", axes=AXES, tol=0.0)
    cache.advance(1)
    assert cache.length == 4, f"length after advance(3) and advance(1) is {cache.length}; expected 4"


def test_ex5_6_fills_exactly_to_max_tokens(ex):
    cache = ex.ContiguousKVCache(TINY, max_tokens=6)
    rng = np.random.default_rng(2)
    cache.write(0, *kv(rng, 4))
    cache.advance(4)
    try:
        cache.write(0, *kv(rng, 2))
    except ex.CacheFullError:
        pytest.fail("4 tokens cached and 2 more make 6 = max_tokens: they fit, so write must not raise "
                    "CacheFullError — the capacity check is off by one (length + T > max_tokens is full)",
                    pytrace=False)
    cache.advance(2)
    with pytest.raises(ex.CacheFullError):
        cache.write(0, *kv(rng, 1))


def test_ex5_6_the_model_runs_on_your_cache(ex, tiny_net):
    ids = [3, 9, 27, 17, 51, 25, 11, 33]
    full = tiny_net.forward(ids)
    # in the checks the learner backend puts it in: a mistake is named before attention runs
    cache = CheckedKVCache(ex.ContiguousKVCache(tiny_net.config, max_tokens=len(ids)), yours=True)
    steps = [tiny_net.forward(ids[:4], cache)] + [tiny_net.forward([t], cache) for t in ids[4:]]
    # one token at a time or all at once: the same sums in other orders (float32_tolerance)
    assert_matches(np.concatenate(steps), full, what="the logits decoded on your cache (a prompt of 4, then "
                   "4 single tokens)", axes=("token", "vocab entry"), tol=float32_tolerance(tiny_net.config),
                   note=" — they must equal the no-cache forward's")
    assert cache.length == len(ids)


@pytest.mark.model
def test_ex5_6_smollm2_cached_equals_uncached(ex, model_path):
    net = llmrs.load(model_path).network
    ids = llmrs.load(model_path).tokenizer.encode("The quick brown fox jumps over the lazy dog because")
    full = net.forward(ids)
    cache = CheckedKVCache(ex.ContiguousKVCache(net.config, max_tokens=len(ids)), yours=True)
    steps = [net.forward(ids[:3], cache)] + [net.forward([t], cache) for t in ids[3:]]
    err, tolerance = normalised_error(np.concatenate(steps), full), float32_tolerance(net.config)
    assert err <= tolerance, (
        f"cached logits differ from the uncached forward by {err:.3g} of the largest logit (want <= {tolerance:.2g})"
    )
