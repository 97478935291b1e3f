"""Exercise 3.6 — Implementing Scaled Dot-Product Attention.

References: a naive loop written here (one query, one head at a time), and
SmolLM2 itself — run with your attention, its next-token log-probabilities
must match Hugging Face transformers' (tests/golden/). A wrong result is
compared with the engine's attention computed with each known mistake
(:func:`attention_variants`), so the message names the mistake it matches.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from llmrs_core import attention as reference
from llmrs_core.testing import assert_matches, backend_with, float32_tolerance

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


AXES = ("query", "head", "dim")


def tolerance(q, k):
    """float32 sums of D products (scores) and of Tk terms (weights times values), in two steps."""
    return float32_tolerance(max(q.shape[-1], k.shape[0]), depth=2)


def softmax_over(q, k, v, causal, axis):
    """Attention with the softmax over another axis of the ``[H, Tq, Tk]`` scores (-2: the
    queries) — a known mistake; with ``axis=-1`` it is the reference (tests/core proves it)."""
    tq, hq, d = q.shape
    tk, hkv, _ = k.shape
    kk, vv = np.repeat(k, hq // hkv, axis=1), np.repeat(v, hq // hkv, axis=1)
    scores = np.einsum("qhd,khd->hqk", q.astype(np.float64), kk) / math.sqrt(d)
    if causal:
        scores = np.where(reference.causal_mask(tq, tk), scores, -np.inf)
    return np.einsum("hqk,khd->qhd", reference.softmax(scores, axis=axis), vv)


def attention_variants(q, k, v, causal=True):
    """``(description, output)``: the engine's attention computed with each known mistake."""
    ref = reference.scaled_dot_product_attention
    tq, hq, d = q.shape
    tk, hkv, _ = k.shape
    out = [("without the 1/sqrt(D) scale (scores q.k instead of q.k / sqrt(D))",
            ref(q * np.float32(math.sqrt(d)), k, v, causal))]
    if causal:
        later = ref(q, k, v) if tq == 1 else np.concatenate([ref(q[:-1], k, v), ref(q[-1:], k, v)])
        if tq < tk:
            earlier = ref(q, k[:-1], v[:-1])
        else:  # query 0 sees no key at all: a row of zeros (the reference's convention)
            earlier = np.concatenate([np.zeros_like(q[:1]), ref(q[1:], k[:-1], v[:-1])])
        no_offset = np.concatenate([ref(q[i : i + 1], k[: i + 1], v[: i + 1]) for i in range(tq)])
        out += [
            ("without the causal mask (every query sees every key)", ref(q, k, v, causal=False)),
            ("with the causal mask shifted by one (each query also sees the key after it)", later),
            ("with the causal mask shifted by one (each query misses its own key)", earlier),
            ("with a mask that forgets the cached keys (query i sees keys 0..i, not 0..Tk-Tq+i)", no_offset),
        ]
    if 1 < hkv < hq:
        # np.tile: query head h reads KV head h % Hkv; as the reference sees it, that is head
        # order (h % Hkv) * group + h // Hkv
        group = hq // hkv
        order = np.array([(h % hkv) * group + h // hkv for h in range(hq)])
        shuffled = np.empty_like(q)
        shuffled[:, order] = q
        tiled = ref(shuffled, k, v, causal)[:, order]
        out.append(("with np.tile instead of np.repeat for the KV heads (query head h reading KV head "
                    "h % Hkv instead of h // (Hq / Hkv))", tiled))
    out += [
        ("with the softmax over the queries instead of the keys", softmax_over(q, k, v, causal, axis=-2)),
    ]
    return out


def own_parts_note(ex) -> str:
    """A pointer to the learner's own softmax or causal_mask when one of them is wrong too."""
    wrong = []
    x = np.array([[0.5, -1.0, 2.0], [3.0, 0.0, 1.0]], dtype=np.float32)
    checks = [("softmax", lambda: ex.softmax(x), reference.softmax(x)),
              ("causal_mask", lambda: ex.causal_mask(2, 3), reference.causal_mask(2, 3))]
    for name, call, want in checks:
        try:
            got = np.asarray(call())
        except NotImplementedError:
            continue
        except Exception:
            wrong.append(name)
            continue
        if got.shape != want.shape or not np.allclose(got, want, rtol=1e-5):
            wrong.append(name)
    return f" (your {' and '.join(wrong)} fail{'s' if len(wrong) == 1 else ''} too: see its own test)" if wrong else ""


def test_ex3_6_softmax(ex):
    x = np.array([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]], dtype=np.float32)
    tol = float32_tolerance(3)
    assert_matches(ex.softmax(x), reference.softmax(x), [("over axis 0 instead of the last axis",
                   reference.softmax(x, axis=0))], what="your softmax(x)", axes=("row", "column"), tol=tol)
    assert_matches(ex.softmax(x, axis=0), reference.softmax(x, axis=0), [("over the last axis instead of `axis`",
                   reference.softmax(x, axis=-1))], what="your softmax(x, axis=0)", axes=("row", "column"), tol=tol)
    big = ex.softmax(np.array([1000.0, 1001.0, 1002.0], dtype=np.float32))
    assert np.all(np.isfinite(big)), "softmax([1000, 1001, 1002]) overflowed: subtract the max before exp"
    assert_matches(big, reference.softmax(x[0]), what="your softmax([1000, 1001, 1002])", axes=("entry",), tol=tol)
    masked = ex.softmax(np.array([-np.inf, -np.inf], dtype=np.float32))
    assert np.array_equal(masked, [0.0, 0.0]), f"an all-masked row must give zeros, got {masked}"


def mask_variants(tq, tk):
    """``(description, mask)``: the reference mask with each known mistake."""
    out = [("shifted by one (query i also sees the key after its own)", reference.causal_mask(tq, tk + 1)[:, :tk])]
    if tk > 1:
        out.append(("shifted by one (query i misses its own key)",
                    np.pad(reference.causal_mask(tq, tk - 1), ((0, 0), (0, 1)))))
    out.append(("for Tq queries over Tq keys (np.tril: query i sees keys 0..i, not 0..Tk-Tq+i)",
                np.pad(reference.causal_mask(tq, tq), ((0, 0), (0, tk - tq)))))
    out.append(("transposed (query i sees keys i and after)", reference.causal_mask(tq, tk)[::-1, ::-1]))
    return out


@pytest.mark.parametrize("tq, tk", [(3, 3), (2, 4), (1, 5), (4, 6)])
def test_ex3_6_causal_mask(ex, tq, tk):
    got = ex.causal_mask(tq, tk)
    assert np.asarray(got).dtype == bool, f"causal_mask returns dtype {np.asarray(got).dtype}; expected bool"
    assert_matches(np.asarray(got, dtype=float), reference.causal_mask(tq, tk).astype(float),
                   [(d, m.astype(float)) for d, m in mask_variants(tq, tk)],
                   what=f"your causal_mask({tq}, {tk})", axes=("query", "key"), tol=0.0,
                   note=f" — the queries are the last {tq} of {tk} positions, so query i sees keys 0..{tk - tq}+i")


@pytest.mark.parametrize(
    "tq, tk, hq, hkv",
    [(5, 5, 1, 1), (6, 6, 4, 4), (7, 7, 9, 3), (1, 9, 9, 3), (3, 8, 6, 2)],
    ids=["one head", "multi-head", "GQA prefill", "GQA decode step", "GQA chunk"],
)
def test_ex3_6_matches_the_naive_loop(ex, tq, tk, hq, hkv):
    q, k, v = qkv(tq, tk, hq, hkv, 16)
    for causal in (True, False):
        got = ex.scaled_dot_product_attention(q, k, v, causal=causal)
        assert_matches(got, naive_attention(q, k, v, causal=causal), attention_variants(q, k, v, causal),
                       what=f"your attention (causal={causal})", axes=AXES, tol=tolerance(q, k),
                       note=own_parts_note(ex))


def test_ex3_6_gqa_uses_the_right_kv_head(ex):
    """Query heads 0-2 must read KV head 0, heads 3-5 KV head 1 (not heads 0, 2, 4 ...)."""
    q, k, v = qkv(1, 4, 6, 2, 8)
    v[:, 0], v[:, 1] = 1.0, -1.0
    out = ex.scaled_dot_product_attention(q, k, v)
    assert np.allclose(out[0, :3], 1.0) and np.allclose(out[0, 3:], -1.0), (
        "query head h uses KV head h // (Hq // Hkv): heads 0-2 read KV head 0, heads 3-5 KV head 1 "
        f"(yours gave heads 0-5 the values {np.round(out[0, :, 0], 3).tolist()}; np.repeat, not np.tile)"
    )


def test_ex3_6_returns_float32(ex):
    q, k, v = qkv(3, 5, 4, 2, 8)
    got = ex.scaled_dot_product_attention(q, k, v)
    assert got.dtype == np.float32, (
        f"float32 q, k, v must give float32 attention, got {got.dtype}: the engine's activations are float32 "
        "(a float64 sqrt or mask promotes everything; cast it, or use np.float32 constants)"
    )


def test_ex3_6_rejects_bad_shapes(ex):
    q, k, v = qkv(2, 4, 6, 4, 8)
    with pytest.raises(ValueError):
        ex.scaled_dot_product_attention(q, k, v)  # 6 query heads, 4 KV heads
    q, k, v = qkv(2, 4, 4, 2, 8)
    with pytest.raises(ValueError):
        ex.scaled_dot_product_attention(q[..., :4], k, v)  # head_dim 4 vs 8


def test_ex3_6_rejects_more_queries_than_keys(ex):
    q, k, v = qkv(5, 3, 4, 2, 8)
    try:
        ex.scaled_dot_product_attention(q, k, v)
    except ValueError:
        return
    pytest.fail("5 queries over 3 keys must raise ValueError: the queries are the newest of the Tk positions, "
                "so there can be no more of them than keys")


@pytest.mark.model
def test_ex3_6_smollm2_with_your_attention_matches_transformers(ex, logprob_error):
    err = logprob_error(backend_with(attention=ex.scaled_dot_product_attention))
    assert err < 1e-3, f"with your attention SmolLM2's log-probabilities are off by {err:.3g} (want < 1e-3)"
