"""Exercise 8.6 — SIMD Matrix Multiplication: a single-threaded Numba Q4 matvec over the
interleaved layout, checked against the dequantised product and by reading its assembly.

A wrong product is compared with the product computed with each known kernel mistake
(:func:`llmrs_core.testing.q4_matvec_variants`: nibbles swapped or in pack_int4's order,
no ``m * sum(x)``, rows in the wrong order, x's blocks 16 apart), so the message names the
one it matches. The other likely mistakes have a test each: the padding rows not sliced
away, input not converted to contiguous float32 (checked against the learner's own kernel
on float32 input, so that a kernel bug is never blamed on the wrapper), no fastmath, a loop
order that does not vectorise, float64 arithmetic in the loop (a bare ``16``, an array
without a dtype). Each mistake is planted in tests/core/test_diagnose_ch08.py.
"""

from __future__ import annotations

import numba
import numpy as np
import pytest
from numba.core.errors import TypingError
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
def test_ex8_6_matches_the_dequantised_product(ex, rows, cols, compiled):
    w, dense = random_q4(rows, cols, seed=rows + cols)
    x = np.random.default_rng(1).standard_normal(cols).astype(np.float32)
    y = compiled("q4_matvec_kernel", ex.q4_matvec_simd, w, x)
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


def test_ex8_6_accepts_float64_and_strided_input(ex, compiled):
    """The wrapper's conversion, told apart from the kernel: a float64, strided ``x`` must give
    what the learner's own kernel gives for the same values as contiguous float32."""
    w, dense = random_q4(64, 96, seed=5)  # 64 rows: whole groups, no padding to slice
    x = np.random.default_rng(2).standard_normal(2 * 96)[::2]  # float64, every other value: not contiguous
    x32 = np.ascontiguousarray(x, dtype=np.float32)
    tol = float32_tolerance(96)
    yours = compiled("q4_matvec_kernel", ex.q4_matvec_simd, w, x32)
    err = normalised_error(yours, dense @ x32.astype(np.float64))
    if not (isinstance(yours, np.ndarray) and yours.shape == (64,)) or err > tol:
        pytest.fail(
            "not the conversion: your q4_matvec_simd is already wrong for contiguous float32 x (the input this "
            "test compares against), so the kernel is what to fix first — test_ex8_6_matches_the_dequantised_product "
            "says how. This test checks the wrapper's conversion once the kernel is right.",
            pytrace=False,
        )
    kernel = ex.q4_matvec_kernel
    # the types the kernel was compiled for so far: a new one after the call below is x as it came in
    before = set(kernel.signatures) if isinstance(kernel, CPUDispatcher) else None
    convert = "Convert x in q4_matvec_simd, before calling the kernel: x = np.ascontiguousarray(x, dtype=np.float32)."
    try:
        got, error = ex.q4_matvec_simd(w, x), None
    except TypingError as e:
        error = str(e)
    if error is not None:  # failed outside the except block: pytest then leaves out Numba's whole error
        first = error.strip().splitlines()[:3]
        pytest.fail(
            "q4_matvec_simd passed x to the kernel without making it contiguous float32 (this test's x is "
            f"float64 and strided, Numba's type {numba.typeof(x)}), and Numba could not compile "
            "q4_matvec_kernel for it (for contiguous float32 x your kernel compiles):\n    "
            + "\n    ".join(first) + f"\n{convert}",
            pytrace=False,
        )
    if before is not None:
        extra = [sig[-1] for sig in kernel.signatures if sig not in before]
        if extra:
            t = extra[0]  # the type of x the kernel was compiled for
            dtype, layout = getattr(t, "dtype", t), getattr(t, "layout", "C")
            wide = dtype != numba.float32
            how = " and ".join(([f"as {dtype}"] if wide else []) + (["not contiguous"] if layout != "C" else []))
            pytest.fail(
                f"q4_matvec_simd passed x to the kernel {how} (Numba's type {t}), so Numba compiled a second "
                "version of q4_matvec_kernel for that type"
                + (", which computes in float64: half the lanes per vector register, plus conversions" if wide
                   else "") + f". {convert}",
                pytrace=False,
            )
    assert isinstance(got, np.ndarray) and got.dtype == np.float32, (
        f"for a float64 x, q4_matvec_simd returned {getattr(got, 'dtype', type(got).__name__)}; it should "
        f"return float32 whatever x is. {convert}"
    )
    err = normalised_error(got, yours)
    assert err <= tol, (
        f"for a float64, strided x your q4_matvec_simd gives other values than for the same x as contiguous "
        f"float32 (normalised difference {err:.2g}, allowed {tol:.2g}). {convert}"
    )


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
    assert summary["packed_double"] == 0, (
        f"q4_matvec_kernel computes in float64: {summary['packed_double']} vector instructions on doubles "
        f"(...pd: vcvtps2pd, vcvtdq2pd, vfmadd...pd, vmulpd) in its assembly, {summary['packed_fma']} packed "
        "float32 FMAs. Vectorised in doubles, a register holds half as many lanes (4 in a ymm, not 8) and "
        "every value is converted on the way in and out: 1.8 to 2.6 times slower, measured on AVX2. To Numba "
        "a bare number is 64-bit, and int64 or float64 with float32 gives float64: `16 * high` or `0.5 * v` "
        "turns the whole expression into float64, and so does an array made without a dtype (np.zeros(LANES) "
        "is float64). Name the constant once before the loops, sixteen = np.float32(16), and give every "
        "array np.float32."
    )
    assert summary["packed_fma"] > 0, (
        f"q4_matvec_kernel compiled to no packed FMA (vfmadd...ps on ymm/zmm registers): {summary}. "
        "The multiply-adds run one float at a time. Make the innermost loop run over `lane` "
        "(32 independent rows, contiguous in memory), accumulate into a small float32 array "
        "indexed by lane, keep the conversions in 32 bits (high = np.float32(byte >> 4), "
        "low = np.float32(byte) - sixteen * high, with sixteen = np.float32(16)), and compile with fastmath=True."
    )
