"""Exercise 3.7 — Implementing RoPE.

References: rotations written out pair by pair here, the identity that makes
RoPE relative, and SmolLM2 run with your RoPE against Hugging Face transformers.
A wrong result is compared with the engine's RoPE computed with each known
mistake (:func:`rope_variants`), so the message names the mistake it matches;
the permutation test uses the engine's RoPE, so only your permutation is judged there.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from llmrs_core import rope as reference
from llmrs_core.testing import assert_matches, backend_with, float32_tolerance


def naive_rope(x, positions, theta, pairs):
    out = x.astype(np.float64).copy()
    d = x.shape[-1]
    for t, p in enumerate(positions):
        for i, (a, b) in enumerate(pairs(d)):
            angle = p * theta ** (-2 * i / d)
            c, s = math.cos(angle), math.sin(angle)
            out[t, :, a] = x[t, :, a] * c - x[t, :, b] * s
            out[t, :, b] = x[t, :, a] * s + x[t, :, b] * c
    return out


def interleaved_pairs(d):
    return [(2 * i, 2 * i + 1) for i in range(d // 2)]


def half_pairs(d):
    return [(i, i + d // 2) for i in range(d // 2)]


def sample(t=6, h=3, d=16, seed=0):
    return np.random.default_rng(seed).standard_normal((t, h, d)).astype(np.float32)


AXES = ("token", "head", "dim")
TOL = float32_tolerance(2)  # each output is a two-term sum, x0 cos - x1 sin, in float32


def rope_variants(x, pos, theta, layout):
    """``(description, output)``: the engine's RoPE (``layout`` "interleaved" or "half") with each
    known mistake."""
    right, other = (
        (reference.apply_rope_interleaved, reference.apply_rope_half) if layout == "interleaved"
        else (reference.apply_rope_half, reference.apply_rope_interleaved)
    )
    pairs = "(2i, 2i+1)" if layout == "interleaved" else "(i, i + D/2)"
    wrong_pairs = "(i, i + D/2)" if layout == "interleaved" else "(2i, 2i+1)"
    return [
        (f"with the other pairing: dimensions {wrong_pairs} instead of {pairs}", other(x, pos, theta)),
        # theta ** (-i/D) for i < D/2 is sqrt(theta) ** (-2i/D)
        ("with frequencies theta**(-i/D) instead of theta**(-2i/D)", right(x, pos, math.sqrt(theta))),
        ("with positions starting at 1 instead of 0", right(x, np.asarray(pos) + 1, theta)),
        ("rotating the wrong way (the signs of the sin terms swapped)", right(x, -np.asarray(pos), theta)),
    ]


def test_ex3_7_rope_frequencies(ex):
    f = ex.rope_frequencies(8, 10000.0)
    assert np.asarray(f).shape == (4,), f"rope_frequencies(8, ...) has shape {np.asarray(f).shape}; expected (4,): one per pair"
    assert_matches(f, [1.0, 10000 ** -0.25, 10000 ** -0.5, 10000 ** -0.75],
                   [("as theta**(-i/D) instead of theta**(-2i/D)", reference.rope_frequencies(8, 100.0)),
                    ("as theta**(2i/D): the exponent's sign is lost", 1 / reference.rope_frequencies(8, 10000.0))],
                   what="your rope_frequencies(8, 1e4)", axes=("pair",), tol=1e-12)
    assert f.dtype == np.float64, "compute the frequencies in float64"
    assert ex.rope_frequencies(64, 1e5).shape == (32,)
    with pytest.raises(ValueError):
        ex.rope_frequencies(7, 10000.0)


@pytest.mark.parametrize("theta", [10000.0, 100000.0])
def test_ex3_7_interleaved_matches_pairwise_rotation(ex, theta):
    x, pos = sample(), np.array([0, 1, 2, 5, 100, 4000])
    got = ex.apply_rope_interleaved(x, pos, theta)
    assert_matches(got, naive_rope(x, pos, theta, interleaved_pairs), rope_variants(x, pos, theta, "interleaved"),
                   what="your interleaved RoPE", axes=AXES, tol=TOL,
                   note=" (the tokens sit at positions [0, 1, 2, 5, 100, 4000])")
    assert got.shape == x.shape and got.dtype == np.float32, f"float32 x must give float32, got {got.dtype}"


def test_ex3_7_half_matches_pairwise_rotation(ex):
    x, pos = sample(), np.array([0, 1, 2, 5, 100, 4000])
    got = ex.apply_rope_half(x, pos, 1e5)
    assert_matches(got, naive_rope(x, pos, 1e5, half_pairs), rope_variants(x, pos, 1e5, "half"),
                   what="your half-split RoPE", axes=AXES, tol=TOL,
                   note=" (the tokens sit at positions [0, 1, 2, 5, 100, 4000])")


def test_ex3_7_rotation_properties(ex):
    x = sample()
    assert_matches(ex.apply_rope_interleaved(x, np.zeros(6), 1e4), x, what="your interleaved RoPE at position 0",
                   axes=AXES, tol=TOL, note=" (position 0 turns by angle 0: no rotation)")
    rotated = ex.apply_rope_interleaved(x, np.arange(6) * 37, 1e4)
    assert_matches(np.linalg.norm(rotated, axis=-1), np.linalg.norm(x, axis=-1), what="the length of each rotated "
                   "vector", axes=("token", "head"), tol=float32_tolerance(16, depth=2),
                   note=" (a rotation keeps lengths: cos and sin of the same angle in each pair)")
    # relative position: q at m and k at n give the same score as q at m+s and k at n+s
    q, k = sample(1, 1, 16, 1), sample(1, 1, 16, 2)
    for rope in (ex.apply_rope_interleaved, ex.apply_rope_half):
        s1 = (rope(q, np.array([7]), 1e4) * rope(k, np.array([3]), 1e4)).sum()
        s2 = (rope(q, np.array([107]), 1e4) * rope(k, np.array([103]), 1e4)).sum()
        assert abs(s1 - s2) < 1e-4, (
            f"with your {rope.__name__}, q.k must depend only on the distance m - n: q at 7 and k at 3 give "
            f"{s1:.6g}, q at 107 and k at 103 give {s2:.6g}"
        )


def test_ex3_7_permutation_makes_the_two_forms_agree(ex):
    """Only permute_for_interleaved is judged here: both RoPEs are the engine's."""
    rng = np.random.default_rng(3)
    n_heads, d, d_in, t = 3, 16, 24, 5
    w_q = rng.standard_normal((n_heads * d, d_in)).astype(np.float32)
    w_k = rng.standard_normal((n_heads * d, d_in)).astype(np.float32)
    small = np.arange(4, dtype=np.float32)[:, None]
    assert ex.permute_for_interleaved(small, 1)[:, 0].tolist() == [0, 2, 1, 3], (
        "rows [0, 1 | 2, 3] of one head become [0, 2, 1, 3]: first-half row i goes to 2i"
    )
    wq_p, wk_p = ex.permute_for_interleaved(w_q, n_heads), ex.permute_for_interleaved(w_k, n_heads)
    assert_matches(wq_p, reference.permute_for_interleaved(w_q, n_heads),
                   [("backwards (GGUF's row order back to HF's: the inverse permutation)",
                     reference.unpermute_from_interleaved(w_q, n_heads)),
                    ("over the whole matrix as one head, not head by head",
                     reference.permute_for_interleaved(w_q, 1))],
                   what=f"your permute_for_interleaved(W_q, n_heads={n_heads})", axes=("row", "column"), tol=0.0)
    x = rng.standard_normal((t, d_in)).astype(np.float32)
    pos = np.arange(t)
    hf_q = reference.apply_rope_half((x @ w_q.T).reshape(t, n_heads, d), pos, 1e4)
    hf_k = reference.apply_rope_half((x @ w_k.T).reshape(t, n_heads, d), pos, 1e4)
    gg_q = reference.apply_rope_interleaved((x @ wq_p.T).reshape(t, n_heads, d), pos, 1e4)
    gg_k = reference.apply_rope_interleaved((x @ wk_p.T).reshape(t, n_heads, d), pos, 1e4)
    scores_hf = np.einsum("thd,shd->hts", hf_q, hf_k)
    scores_gguf = np.einsum("thd,shd->hts", gg_q, gg_k)
    assert_matches(scores_gguf, scores_hf, what="interleaved RoPE on your permuted weights", axes=("head", "query", "key"),
                   tol=float32_tolerance(d_in * d, depth=2),
                   note=" (the scores of half-split RoPE on the original weights)")


@pytest.mark.model
def test_ex3_7_smollm2_with_your_rope_matches_transformers(ex, logprob_error):
    err = logprob_error(backend_with(rope=ex.apply_rope_interleaved))
    assert err < 1e-3, (
        f"with your RoPE SmolLM2's log-probabilities are off by {err:.3g}: GGUF weights need the "
        "interleaved form, and SmolLM2's theta is 1e5"
    )
