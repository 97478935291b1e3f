"""Exercise 8.6 — SIMD Matrix Multiplication: a single-threaded Numba Q4 matvec over the
interleaved layout, checked against the dequantised product and by reading its assembly.

A wrong product is compared with the product computed with each known kernel mistake
(:func:`llmrs_core.testing.q4_matvec_variants`: nibbles swapped or in pack_int4's order,
no ``m * sum(x)``, rows in the wrong order), so the message names the one it matches.
The other likely mistakes have a test each: the padding rows not sliced away, input
not converted to contiguous float32, no fastmath, a loop order that does not vectorise.
"""

from __future__ import annotations

import numpy as np
import pytest
from numba.core.registry import CPUDispatcher

from llmrs_core.kernels.cpu.inspect import assembly, packed_fma_unavailable, vector_summary
from llmrs_core.kernels.cpu.packing import LANES, pack_q8
from llmrs_core.testing import (
    assert_matches,
    float32_tolerance,
    normalised_error,
    q4_matvec_variants,
    random_q4,
)

# (rows, cols): whole groups of 32 rows, rows that leave padding, one block, a SmolLM2 shape
SHAPES = [(32, 32), (64, 96), (100, 64), (7, 320), (1536, 576)]
# against the float64 product, a float32 kernel summing `cols` terms in its own order is off by
# about sqrt(cols) * 2^-24 of the largest output (float32_tolerance: that, times a safety of 10)


def kernel_args(rows: int = 64, cols: int = 96, seed: int = 0):
    w, _ = random_q4(rows, cols, seed)
    x = np.random.default_rng(seed + 1).standard_normal(cols).astype(np.float32)
    return w, x


@pytest.mark.parametrize("rows, cols", SHAPES)
def test_ex8_6_matches_the_dequantised_product(ex, rows, cols):
    w, dense = random_q4(rows, cols, seed=rows + cols)
    x = np.random.default_rng(1).standard_normal(cols).astype(np.float32)
    y = ex.q4_matvec_simd(w, x)
    assert isinstance(y, np.ndarray) and y.shape == (rows,), (
        f"q4_matvec_simd should return one value per row, shape ({rows},); got "
        f"{getattr(y, 'shape', type(y).__name__)}"
        + (" — slice away the padding rows of the last group" if getattr(y, "shape", None) == (w.qs.shape[0] * LANES,)
           else "")
    )
    assert y.dtype == np.float32, f"the result should be float32, got {y.dtype}"
    assert_matches(y, dense @ x.astype(np.float64), q4_matvec_variants(w, x), what=f"your q4_matvec_simd [{rows}, {cols}]",
                   axes=("row",), tol=float32_tolerance(cols),
                   note=". Per block: d * sum(q * x) + m * sum(x); the low nibble of byte j goes with x[32 b + j], "
                   "the high nibble with x[32 b + 16 + j]; row 32 g + lane is lane `lane` of group g.")


def test_ex8_6_kernel_returns_every_lane(ex, compiled):
    w, x = kernel_args(rows=40, cols=64)
    out = compiled("q4_matvec_kernel", ex.q4_matvec_kernel, w.qs, w.d, w.m, x)
    groups = w.qs.shape[0]
    assert isinstance(out, np.ndarray) and out.shape == (groups * LANES,), (
        f"q4_matvec_kernel returns one value per row of every group, padding included: "
        f"shape ({groups * LANES},) for {groups} groups; got {getattr(out, 'shape', type(out).__name__)}"
    )
    assert out.dtype == np.float32, f"the kernel's output should be float32, got {out.dtype}"
    assert np.all(out[w.rows:] == 0), "padding rows have zero codes and scales: their outputs should be 0"


def test_ex8_6_rejects_what_the_kernel_cannot_read(ex):
    w, x = kernel_args()
    with pytest.raises(ValueError):
        ex.q4_matvec_simd(w, x[:-1])  # too short: the compiled kernel would read past the end
    with pytest.raises(ValueError):
        ex.q4_matvec_simd(w, np.ones((1, w.cols), np.float32))
    q8 = pack_q8(np.ones((32, 64), np.int8), np.ones((32, 2), np.float32), "q8")
    with pytest.raises(ValueError):
        ex.q4_matvec_simd(q8, np.ones(64, np.float32))


def test_ex8_6_accepts_float64_and_strided_input(ex):
    w, dense = random_q4(64, 96, seed=5)
    x = np.random.default_rng(2).standard_normal(2 * 96)[::2]  # float64, not contiguous
    err = normalised_error(ex.q4_matvec_simd(w, x), dense @ x)
    assert err <= float32_tolerance(96), "convert x to contiguous float32 before calling the kernel"


def test_ex8_6_kernel_is_compiled_with_fastmath(ex, compiled):
    w, x = kernel_args()
    compiled("q4_matvec_kernel", ex.q4_matvec_kernel, w.qs, w.d, w.m, x)
    kernel = ex.q4_matvec_kernel
    assert isinstance(kernel, CPUDispatcher), (
        "q4_matvec_kernel is not compiled by Numba: decorate it with @njit(fastmath=True)"
    )
    assert kernel.targetoptions.get("fastmath"), (
        "q4_matvec_kernel is compiled without fastmath: LLVM may then neither reorder float sums "
        "nor fuse a multiply and an add into one FMA. Use @njit(fastmath=True)."
    )


def test_ex8_6_kernel_vectorises(ex, compiled):
    w, x = kernel_args(rows=1536, cols=576)
    compiled("q4_matvec_kernel", ex.q4_matvec_kernel, w.qs, w.d, w.m, x)  # a stub stops here, with its message
    reason = packed_fma_unavailable()
    if reason:
        pytest.skip(reason)
    kernel = ex.q4_matvec_kernel
    fastmath = bool(getattr(kernel, "targetoptions", {}).get("fastmath", False))
    summary = vector_summary(assembly(kernel, w.qs, w.d, w.m, x, fastmath=fastmath))
    assert summary["packed_fma"] > 0, (
        f"q4_matvec_kernel compiled to no packed FMA (vfmadd...ps on ymm/zmm registers): {summary}. "
        "The multiply-adds run one float at a time. Make the innermost loop run over `lane` "
        "(32 independent rows, contiguous in memory), accumulate into a small float32 array "
        "indexed by lane, keep the conversions in 32 bits (np.float32(byte), byte >> 4, "
        "byte - 16 * high), and compile with fastmath=True."
    )
