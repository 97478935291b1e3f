"""Exercise 3.6 — Implementing Scaled Dot-Product Attention.

References: a naive loop written here (one query, one head at a time), and
SmolLM2 itself — run with your attention, its next-token log-probabilities
must match Hugging Face transformers' (tests/golden/).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from llmrs_core.testing import backend_with

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def naive_attention(q, k, v, causal=True):
    tq, hq, d = q.shape
    tk, hkv, _ = k.shape
    out = np.zeros((tq, hq, d))
    for h in range(hq):
        kv = h // (hq // hkv)
        for i in range(tq):
            scores = [
                q[i, h] @ k[j, kv] / math.sqrt(d) if (not causal or j <= tk - tq + i) else -math.inf
                for j in range(tk)
            ]
            m = max(scores)
            w = [math.exp(s - m) for s in scores]
            out[i, h] = sum(wj * v[j, kv] for j, wj in enumerate(w)) / sum(w)
    return out


def qkv(tq, tk, hq, hkv, d, seed=0):
    rng = np.random.default_rng(seed)
    return (
        rng.standard_normal((tq, hq, d)).astype(np.float32),
        rng.standard_normal((tk, hkv, d)).astype(np.float32),
        rng.standard_normal((tk, hkv, d)).astype(np.float32),
    )


def test_ex3_6_softmax(ex):
    x = np.array([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]], dtype=np.float32)
    want = np.exp(x) / np.exp(x).sum(axis=-1, keepdims=True)
    np.testing.assert_allclose(ex.softmax(x), want, rtol=1e-6)
    np.testing.assert_allclose(ex.softmax(x, axis=0), np.exp(x) / np.exp(x).sum(axis=0), rtol=1e-6)
    big = ex.softmax(np.array([1000.0, 1001.0, 1002.0], dtype=np.float32))
    assert np.all(np.isfinite(big)), "softmax([1000, 1001, 1002]) overflowed: subtract the max before exp"
    np.testing.assert_allclose(big, want[0], rtol=1e-6)
    masked = ex.softmax(np.array([-np.inf, -np.inf], dtype=np.float32))
    assert np.array_equal(masked, [0.0, 0.0]), f"an all-masked row must give zeros, got {masked}"


def test_ex3_6_causal_mask(ex):
    assert np.array_equal(ex.causal_mask(3, 3), [[1, 0, 0], [1, 1, 0], [1, 1, 1]])
    assert np.array_equal(ex.causal_mask(2, 4), [[1, 1, 1, 0], [1, 1, 1, 1]]), (
        "2 queries over 4 keys: the queries are positions 2 and 3, so the first sees keys 0..2"
    )
    assert ex.causal_mask(1, 5).all(), "the newest token (decoding) sees every key"
    assert ex.causal_mask(4, 4).dtype == bool


@pytest.mark.parametrize(
    "tq, tk, hq, hkv",
    [(5, 5, 1, 1), (6, 6, 4, 4), (7, 7, 9, 3), (1, 9, 9, 3), (3, 8, 6, 2)],
    ids=["one head", "multi-head", "GQA prefill", "GQA decode step", "GQA chunk"],
)
def test_ex3_6_matches_the_naive_loop(ex, tq, tk, hq, hkv):
    q, k, v = qkv(tq, tk, hq, hkv, 16)
    got = ex.scaled_dot_product_attention(q, k, v, causal=True)
    assert got.shape == (tq, hq, 16), f"output shape {got.shape}, expected [Tq, Hq, D] = {(tq, hq, 16)}"
    np.testing.assert_allclose(got, naive_attention(q, k, v), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(
        ex.scaled_dot_product_attention(q, k, v, causal=False), naive_attention(q, k, v, causal=False),
        rtol=1e-4, atol=1e-5,
    )


def test_ex3_6_gqa_uses_the_right_kv_head(ex):
    """Query heads 0-2 must read KV head 0, heads 3-5 KV head 1 (not heads 0, 2, 4 ...)."""
    q, k, v = qkv(1, 4, 6, 2, 8)
    v[:, 0], v[:, 1] = 1.0, -1.0
    out = ex.scaled_dot_product_attention(q, k, v)
    assert np.allclose(out[0, :3], 1.0) and np.allclose(out[0, 3:], -1.0), (
        "query head h uses KV head h // (Hq // Hkv)"
    )


def test_ex3_6_rejects_bad_shapes(ex):
    q, k, v = qkv(2, 4, 6, 4, 8)
    with pytest.raises(ValueError):
        ex.scaled_dot_product_attention(q, k, v)  # 6 query heads, 4 KV heads
    q, k, v = qkv(2, 4, 4, 2, 8)
    with pytest.raises(ValueError):
        ex.scaled_dot_product_attention(q[..., :4], k, v)  # head_dim 4 vs 8


@pytest.mark.model
def test_ex3_6_smollm2_with_your_attention_matches_transformers(ex, logprob_error):
    err = logprob_error(backend_with(attention=ex.scaled_dot_product_attention))
    assert err < 1e-3, f"with your attention SmolLM2's log-probabilities are off by {err:.3g} (want < 1e-3)"
