"""Exercise 9.8 — the fused Q4_1 dequantise-and-matvec kernel.

Reference: the engine's Q4_1 dequantiser (``llmrs_core.quant.dequant``, bit-exact with
llama.cpp's) times ``x``, in float64. The blocks come from ``quantize_q4_1`` of random
weights. The output is filled with NaN before your kernel runs. When the result is wrong,
the test compares it with the products of the usual mistakes (each made from the same
dequantised codes) to tell you which one it looks like.
"""

from __future__ import annotations

import numpy as np
import pytest

from llmrs_core.kernels.gpu.arrays import to_device, to_host, xp
from llmrs_core.quant.dequant import fp16_field, split_blocks, unpack_nibbles
from llmrs_core.quant.ggml_blocks import quantize_q4_1
from llmrs_core.quant.types import GGMLType
from llmrs_core.testing import float32_tolerance, normalised_error


def blocks(rows: int, cols: int, rng):
    """``qs [rows, cols/2]``, ``d``, ``m [rows, cols/32]`` of a random Q4_1 matrix, and its codes ``[rows, cols]``."""
    raw = split_blocks(quantize_q4_1(rng.standard_normal((rows, cols)).astype(np.float32)), GGMLType.Q4_1)
    d, m = fp16_field(raw, 0).reshape(rows, -1), fp16_field(raw, 2).reshape(rows, -1)
    codes = unpack_nibbles(raw[:, 4:]).reshape(rows, cols).astype(np.float64)
    return raw[:, 4:].reshape(rows, -1).copy(), d, m, codes


def dense(codes, d, m, with_m: bool = True) -> np.ndarray:
    scale = np.repeat(d, 32, axis=1).astype(np.float64)
    return scale * codes + (np.repeat(m, 32, axis=1) if with_m else 0)


def swap_halves(codes: np.ndarray) -> np.ndarray:
    """Codes as they come out when low and high nibbles are exchanged (weight j <-> j + 16)."""
    b = codes.reshape(codes.shape[0], -1, 2, 16)
    return b[:, :, ::-1].reshape(codes.shape)


def interleaved(codes: np.ndarray) -> np.ndarray:
    """Codes as they come out when byte j is read as weights 2j (low) and 2j + 1 (high)."""
    b = codes.reshape(codes.shape[0], -1, 2, 16)  # [rows, blocks, low/high, j]
    return b.transpose(0, 1, 3, 2).reshape(codes.shape)


def run_and_check(ex, rows: int, cols: int, tokens: int) -> None:
    rng = np.random.default_rng()
    qs, d, m, codes = blocks(rows, cols, rng)
    x = rng.standard_normal((tokens, cols)).astype(np.float32)
    out = xp().empty((tokens, rows), np.float32)
    out[...] = np.nan
    ex.launch_q4_1_matvec(to_device(qs), to_device(d), to_device(m), to_device(x), out)
    got = to_host(out)
    for t in range(tokens):
        for r in range(rows):
            if np.isnan(got[t, r]):
                pytest.fail(f"token {t}, row {r}: your kernel left the output untouched — did every thread "
                            f"(or group of threads) get a row, and does the grid cover all {rows} rows and {tokens} tokens?")
    want = x.astype(np.float64) @ dense(codes, d, m).T
    tol = float32_tolerance(cols)
    err = normalised_error(got, want)
    if err <= tol:
        return
    x64 = x.astype(np.float64)
    mistakes = {
        "the nibble order looks swapped: byte j of a block holds weight j in its LOW nibble (byte & 15) and "
        "weight j + 16 in its HIGH nibble (byte >> 4)": x64 @ dense(swap_halves(codes), d, m).T,
        "the nibbles pair weights j and j + 16 of the block, not 2j and 2j + 1": x64 @ dense(interleaved(codes), d, m).T,
        "the minimum is missing: w = d * q + m, so add m * sum(x_b) for every block": x64 @ dense(codes, d, m, False).T,
        "every block of a row has used block 0's scale and minimum: block b of row r has d[r, b] and m[r, b]":
            x64 @ dense(codes, np.repeat(d[:, :1], d.shape[1], axis=1), np.repeat(m[:, :1], m.shape[1], axis=1)).T,
    }
    for hint, result in mistakes.items():
        if normalised_error(got, result) <= 1e-3:
            pytest.fail(f"{hint} (normalised error against the reference {err:.2e})")
    worst = np.unravel_index(np.argmax(np.abs(got - want)), got.shape)
    pytest.fail(f"normalised error {err:.2e} (allowed {tol:.1e}); worst at token {worst[0]}, row {worst[1]}: "
                f"{got[worst]:.5g} instead of {want[worst]:.5g}")


def test_ex9_8_one_token(ex):
    run_and_check(ex, rows=8, cols=64, tokens=1)


def test_ex9_8_more_rows_and_blocks(ex):
    """Four 32-weight blocks per row, a row count that no block size divides."""
    run_and_check(ex, rows=13, cols=128, tokens=1)


def test_ex9_8_several_tokens(ex):
    run_and_check(ex, rows=6, cols=64, tokens=3)
