"""Tiled online-softmax ("flash") attention gives the same result as the plain one."""

from __future__ import annotations

import numpy as np
import pytest

from llmrs_core.attention import flash_attention, scaled_dot_product_attention
from llmrs_core.testing import float32_tolerance


@pytest.mark.parametrize("tq, tk, hq, hkv", [(7, 7, 9, 3), (1, 50, 9, 3), (13, 40, 4, 4), (64, 64, 2, 1)])
@pytest.mark.parametrize("block_size", [1, 5, 16, 64])
@pytest.mark.parametrize("causal", [True, False])
def test_flash_equals_plain(tq, tk, hq, hkv, block_size, causal):
    rng = np.random.default_rng(tq * tk + block_size)
    q = rng.standard_normal((tq, hq, 16)).astype(np.float32) * 3
    k = rng.standard_normal((tk, hkv, 16)).astype(np.float32) * 3
    v = rng.standard_normal((tk, hkv, 16)).astype(np.float32)
    want = scaled_dot_product_attention(q, k, v, causal=causal)
    got = flash_attention(q, k, v, causal=causal, block_size=block_size)
    # Scores are sums of D = 16 products, here up to |s| ~ 30 (q and k scaled by 3): in another
    # order (another block shape for BLAS) they differ by about sqrt(16) * 2^-24 * |s|, which exp
    # turns into that relative error of the weights; the sum over Tk weighted values and the
    # online rescaling add about sqrt(Tk) * 2^-24.
    s_max = np.abs(np.einsum("qhd,khd->hqk", q, np.repeat(k, hq // hkv, axis=1))).max() / 4
    tolerance = float32_tolerance(16) * s_max + float32_tolerance(tk)
    np.testing.assert_allclose(got, want, rtol=0, atol=tolerance * np.abs(want).max())


def test_large_scores_do_not_overflow():
    q = np.full((2, 1, 4), 100.0, np.float32)
    k = np.full((3, 1, 4), 100.0, np.float32)
    v = np.arange(12, dtype=np.float32).reshape(3, 1, 4)
    for fn in (scaled_dot_product_attention, flash_attention):
        out = fn(q, k, v)
        assert np.all(np.isfinite(out))
