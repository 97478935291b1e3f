"""The int8 decode kernels (kernels/cpu/int8.py) against NumPy models of the same arithmetic.

* the activations are quantised as the weight type's scheme says (tests/core/test_activation_quant.py
  checks the schemes against ggml's arithmetic);
* the integer part (codes times codes, summed in int32) is exact: with unit scales the kernels
  must return the integer dot product itself;
* with real scales, the result is the float64 sum of the per-block terms up to float32 rounding,
  bounded from the operations the kernel does (see ``rounding_bound``).

Kernels that need AVX2 are skipped, with the reason, where Numba's target lacks it
(``NUMBA_CPU_NAME=generic`` in ``make test-portable``); the dispatch tests run everywhere.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmrs_core.kernels.cpu import int8
from llmrs_core.kernels.cpu.activations import quantize_activations
from llmrs_core.kernels.cpu.packing import pack_affine_q4, pack_q8
from llmrs_core.testing import FLOAT32_ROUNDING

pytestmark = pytest.mark.core

NO_INT8 = int8.int8_unavailable()
needs_int8 = pytest.mark.skipif(NO_INT8 is not None, reason=f"int8 kernels not compiled: {NO_INT8}")


#: the kernel forms, by the GGML type each stands for: (source, code range, weights per scale, offsets?)
FORMS = {
    "q4": ("Q4_1", (0, 16), 32, True),         # 4-bit codes and an offset per 32
    "q4k": ("Q4_K", (0, 16), 32, True),        # the same with Q4_K's integer scales and minimums per 32, d per 256
    "q8": ("Q8_0", (-128, 128), 32, False),    # signed 8-bit codes
    "q5_0": ("Q5_0", (-16, 16), 32, False),    # "q4h": nibble + one bit plane, bias 16
    "q6_k": ("Q6_K", (-32, 32), 16, False),    # "q4h": nibble + two high bits (2-bit fields), bias 32, scale per 16
    "q3_k": ("Q3_K", (-4, 4), 16, False),      # "q4h": nibble only, bias 4, scale per 16
    "q8a": ("Q5_K", (0, 32), 32, True),        # unsigned 8-bit codes with offsets
    "q8a_16": ("Q2_K", (0, 4), 16, True),      # the same per 16
}
KINDS = list(FORMS)


def random_matrix(kind: str, rows: int, cols: int, rng: np.random.Generator):
    """A random matrix's int8 copy and its parts: codes ``[rows, cols]``, ``d``, ``m`` ``[rows, cols / block]``."""
    source, (low, high), block, offsets = FORMS[kind]
    nb = cols // block
    d = rng.uniform(0.001, 0.1, (rows, nb)).astype(np.float32)
    codes = rng.integers(low, high, (rows, cols)).astype(np.uint8 if low >= 0 else np.int8)
    m = rng.uniform(-0.5, 0.5, (rows, nb)).astype(np.float32) if offsets else np.zeros_like(d)
    if kind == "q4":
        return int8.int8_rows(pack_affine_q4(codes, d, m, source)), codes, d, m
    # K-quant scales: d per 256 (ten significant bits, so that its products with the integer scales,
    # the d and m the reference takes, are exact in float32) times an integer per block
    d_super, dmin = (rng.integers(64, 640, (rows, cols // 256)).astype(np.float32) / 65536 for _ in range(2))
    if kind == "q4k":  # w = d sc q - dmin mn, sc and mn 6-bit
        sc, mn = (rng.integers(0, 64, (rows, nb)).astype(np.uint8) for _ in range(2))
        d = np.repeat(d_super, 8, axis=1) * sc.astype(np.float32)
        m = -np.repeat(dmin, 8, axis=1) * mn.astype(np.float32)
        return int8.int8_rows_q4_k_parts(codes, d_super, dmin, sc, mn), codes, d, m
    if offsets:
        return int8.int8_rows_unsigned(codes, d, m, source), codes, d, m
    if source in ("Q6_K", "Q3_K"):  # d per 256 times an int8 sc per 16
        sc = rng.integers(-128, 128, (rows, nb)).astype(np.int8)
        d = np.repeat(d_super, 16, axis=1) * sc.astype(np.float32)
        return int8.int8_rows_planes(codes, (d_super, sc), source, "q8_k"), codes, d, m
    return int8.int8_rows(pack_q8(codes, d, source, block=block)), codes, d, m


def block_terms(codes, d, m, xq, xd, xs):
    """``[T, rows, nb, 2]`` float64, the terms the kernel adds: per block ``d_w d_x (q_w . q_x)``
    (the integer dot product exact: what the int32 lane of its row holds after the block) and
    ``m_w s_x``. Their sum over the last two axes is the product."""
    rows, cols = codes.shape
    nb = d.shape[1]
    sumi = np.einsum("rbj,tbj->trb", codes.reshape(rows, nb, -1).astype(np.int64),
                     xq.reshape(-1, nb, cols // nb).astype(np.int64))
    scale = d.astype(np.float64)[None] * xd.astype(np.float64)[:, None]
    offset = m.astype(np.float64)[None] * xs.astype(np.float64)[:, None]
    return np.stack([scale * sumi, np.broadcast_to(offset, sumi.shape)], axis=-1)


def rounding_bound(terms: np.ndarray) -> np.ndarray:
    """``[T, rows]``: how far the kernel's float32 result may be from the exact sum of ``terms``.

    Per block the kernel rounds ``d_w d_x`` once, then adds the block's scaled integer sum into
    the row's accumulator with a fused multiply-add (one rounding) and the offset term with
    another: ``2 nb`` terms added one after the other. Each passes through at most ``2 nb + 1``
    roundings of relative size u = 2^-24, so the error is at most ``gamma_(2nb+1) * sum |terms|``,
    ``gamma_n = n u / (1 - n u)`` (Higham, ch. 3). The K-quant forms (``q4k``, ``q6_k``, ``q3_k``) add
    their blocks in int32 and round once per 256 weights (a conversion, a product of scales, a fused
    multiply-add per term): fewer roundings of partial sums no larger in magnitude, within the same bound.
    """
    n = 2 * terms.shape[-2] + 1
    gamma = n * FLOAT32_ROUNDING / (1 - n * FLOAT32_ROUNDING)
    return gamma * np.abs(terms).sum(axis=(-2, -1))


def test_row_major_copy_keeps_every_code():
    rng = np.random.default_rng(0)
    for kind in KINDS:
        copy, codes, d, m = random_matrix(kind, 70, 256, rng)  # 70 rows: the last group is padded
        groups, nb = -(-70 // int8.GROUP_ROWS), d.shape[1]
        scales = copy.sc if copy.sc is not None else copy.d  # K-quant scales: an integer per block
        assert copy.qs.shape[0] == groups and scales.shape == (groups, nb * int8.GROUP_ROWS), kind
        qs, d_rows, m_rows = copy.row_major()
        assert d_rows.shape == (70, nb)
        np.testing.assert_array_equal(d_rows, d)
        if FORMS[kind][3]:
            np.testing.assert_array_equal(m_rows, m)
        if kind in ("q4", "q4k"):
            b = qs.reshape(70, -1, 16)
            np.testing.assert_array_equal(np.concatenate([b & 15, b >> 4], -1).reshape(70, 256), codes)
        else:
            np.testing.assert_array_equal(qs, codes, kind)
        if kind in ("q4", "q8"):
            # a group's blocks lie block by block, each in words of four bytes of every row: the first
            # word holds bytes 0..3 of rows 0..7, the next bytes 4..7 of each; block 1 follows block 0
            per_block = 16 if kind == "q4" else 32
            group = qs[: int8.GROUP_ROWS]
            np.testing.assert_array_equal(copy.qs[0, :32], group[:, :4].reshape(-1))
            np.testing.assert_array_equal(copy.qs[0, 32:64], group[:, 4:8].reshape(-1))
            start = int8.GROUP_ROWS * per_block
            np.testing.assert_array_equal(copy.qs[0, start:start + 32], group[:, per_block:per_block + 4].reshape(-1))


def test_bit_planes_hold_the_high_bits_row_by_row():
    """``"q4h"`` with one high bit (Q5_0): per 32-code block a 32-byte word, row r's 32 bits in lane r."""
    codes = np.full((8, 32), -16, np.int8)  # Q5_0's code -16 is stored as 0: no bit set
    codes[3, 5] = 0  # stored 16 = 0b10000: bit 4
    codes[6, 31] = 15  # stored 31: bit 4
    copy = int8.int8_rows_planes(codes, np.ones((8, 1), np.float32), "Q5_0", "q8_0")
    lanes = copy.qh.view(np.uint32).reshape(8)  # block 0's plane: [row]
    want = np.zeros(8, np.uint32)
    want[3], want[6] = 1 << 5, 1 << 31
    np.testing.assert_array_equal(lanes, want)
    np.testing.assert_array_equal(copy.row_major()[0], codes)


def test_crumb_words_hold_two_high_bits_next_to_the_nibble_word():
    """``"q4h"`` with two high bits (Q6_K): per 32-code block two 32-byte crumb words, one per half of
    the block; byte ``4r + i`` of half ``h``'s holds code ``16h + 4k + i``'s bits 4 and 5 at bits
    ``2k, 2k + 1``: the four codes a nibble word's byte ``4r + i`` holds, in the order of the words."""
    codes = np.full((8, 32), -32, np.int8)  # Q6_K's code -32 is stored as 0: no bit set
    codes[3, 5] = 31 - 32  # stored 31 = 0b011111: bit 4 set, bit 5 not; half 0, k = 1, i = 1
    codes[6, 31] = 31  # stored 63: bits 4 and 5; half 1, k = 3, i = 3
    codes = np.concatenate([codes, np.full((8, 224), -32, np.int8)], axis=1)  # a whole super-block
    copy = int8.int8_rows_planes(codes, (np.ones((8, 1), np.float32), np.ones((8, 16), np.int8)), "Q6_K", "q8_k")
    words = copy.qh.reshape(8, 2, 32)[0]  # block 0: [half, byte]
    want = np.zeros((2, 32), np.uint8)
    want[0, 4 * 3 + 1] = 0b01 << 2
    want[1, 4 * 6 + 3] = 0b11 << 6
    np.testing.assert_array_equal(words, want)
    np.testing.assert_array_equal(copy.row_major()[0], codes)
    assert copy.nbytes * 32 == 8 * 256 * (16 + 8 + 2 + 0.5), "32 weights in 26.5 bytes (Q6_K's 26.25), not 40"


def test_each_copy_quantises_its_input_as_llamacpp_does_for_its_type():
    from llmrs_core.quant import registry
    from llmrs_core.quant.types import GGMLType

    ones = np.ones((32, 256), np.int8), np.ones((32, 16), np.float32)
    raw = registry.quantizer(GGMLType.Q6_K)(np.ones((32, 256), np.float32)).reshape(-1)
    q6 = int8.int8_rows_from_blocks(raw, "Q6_K", (32, 256))
    assert (q6.kind, q6.scheme, q6.block) == ("q4h", "q8_k", 16), "Q6_K multiplies Q8_K activations per 16"
    assert int8.int8_rows(pack_q8(*ones, "Q6_K", block=16)) is None, "Q6_K's copy is made from its bytes"
    assert int8.int8_rows(pack_q8(ones[0], ones[1][:, :8], "Q5_0")).scheme == "q8_0"
    assert int8.int8_rows(pack_q8(ones[0], ones[1][:, :8], "IQ4_NL")).kind == "q8"
    codes = np.zeros((32, 256), np.uint8)
    q4k = int8.int8_rows(pack_affine_q4(codes, ones[1][:, :8], ones[1][:, :8], "Q4_K"))
    assert (q4k.scheme, q4k.block) == ("q8_k", 32)
    assert int8.int8_rows(pack_q8(*ones, "F16", block=16)) is None, "a type without a scheme has no copy"


@needs_int8
@pytest.mark.parametrize("kind", KINDS)
@given(seed=st.integers(0, 2**32 - 1), t_count=st.integers(1, 2 * int8.X_ROWS + 3), nb=st.sampled_from([8, 16, 24]),
       extremes=st.booleans())
@settings(max_examples=30, deadline=None)
def test_integer_part_is_exact(kind, seed, t_count, nb, extremes):
    """Unit scales and no offset: the kernel must return the integer dot product, exactly."""
    rng = np.random.default_rng(seed)
    rows, cols = 33, 32 * nb
    copy, codes, _, _ = random_matrix(kind, rows, cols, rng)
    source, (low, high), block, offsets = FORMS[kind]
    if extremes:  # the largest pair sums vpmaddubsw sees: no int16 saturation allowed
        codes[:] = low if low < 0 else high - 1
        ones = np.ones((rows, cols // block), np.float32)
        ones_k = np.ones((rows, cols // 256), np.float32), np.ones((rows, cols // block), np.uint8)
        copy = (int8.int8_rows(pack_affine_q4(codes, ones, 0 * ones, source)) if kind == "q4" else
                int8.int8_rows_q4_k_parts(codes, ones_k[0], 0 * ones_k[0], ones_k[1], 0 * ones_k[1]) if kind == "q4k" else
                int8.int8_rows_unsigned(codes, ones, 0 * ones, source) if offsets else
                int8.int8_rows_planes(codes, (ones[:, :cols // 256], ones.astype(np.int8)), source, "q8_k")
                if source in ("Q6_K", "Q3_K") else int8.int8_rows(pack_q8(codes, ones, source, block=block)))
    copy.d[:] = 1
    copy.m[:] = 0
    if copy.sc is not None:
        copy.sc[:] = 1
    xq = rng.integers(-127, 128, (t_count, cols)).astype(np.int8)
    if extremes:
        xq[:] = -127
    ones = np.ones((t_count, cols // block), np.float32)
    got = int8.products(copy, xq, ones, np.zeros_like(ones))
    want = xq.astype(np.int64) @ codes.astype(np.int64).T  # |values| < 2^24: exact in float32 too
    np.testing.assert_array_equal(got, want.astype(np.float32), f"{kind}: the integer dot products are not exact")


@needs_int8
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("t_count, cols", [(1, 768), (3, 1536), (5, 256), (11, 512)])  # 11: a tile of 8 or two of 4
def test_products_are_the_quantised_arithmetic(kind, t_count, cols):
    rng = np.random.default_rng(t_count + cols)
    copy, codes, d, m = random_matrix(kind, 200, cols, rng)
    x = rng.standard_normal((t_count, cols)).astype(np.float32)
    x[:, 5] *= 40  # an outlier channel, as real activations have
    got = int8.matmul_int8(x, copy)
    xq, xd, xs = quantize_activations(x, copy.scheme, copy.block)
    terms = block_terms(codes, d, m, xq, xd, xs)
    off = np.abs(got - terms.sum(axis=(-2, -1)))
    bound = rounding_bound(terms)
    assert (off <= bound).all(), f"off by {off.max():.3g}, more than float32 rounding allows ({bound.max():.3g})"
    # and against float activations: each moved by at most half its block's step
    block = cols // d.shape[1]
    dense = (codes.reshape(200, -1, block).astype(np.float64) * d[..., None] + m[..., None]).reshape(200, cols)
    # the step of an fp16-rounded scale: half of d_x, and the scale's own rounding (2^-11) on |x|
    step = np.repeat(np.abs(xd.astype(np.float64)) / 2, block, axis=1) + np.abs(x) * 2.0**-11
    assert (np.abs(got - x.astype(np.float64) @ dense.T) <= step @ np.abs(dense).T + bound).all()


@needs_int8
@pytest.mark.parametrize("kind", ["q4", "q4k", "q6_k", "q8"])
def test_a_row_computes_the_same_bits_in_any_chunk_tile_or_alone(kind):
    """Past one chunk (:data:`int8.CHUNK_ROWS`) of activation rows the kernel takes the weights again
    for the next; tiles read the activations tile-major, the rows after the last whole tile read them
    as they are. Each row's numbers must not depend on where it falls: the last tile of a chunk, the
    first of the next, the tail rows, or a step of its own (a wrong tile-major index or chunk boundary
    moves a row's numbers)."""
    rng = np.random.default_rng(7)
    copy, _, _, _ = random_matrix(kind, 24, 512, rng)
    t_count = int8.CHUNK_ROWS + int8.X_ROWS + 3
    xq, xd, xs = quantize_activations(rng.standard_normal((t_count, 512)).astype(np.float32), copy.scheme, copy.block)
    together = int8.products(copy, xq, xd, xs)
    for t in (0, int8.CHUNK_ROWS - 1, int8.CHUNK_ROWS, int8.CHUNK_ROWS + int8.X_ROWS, t_count - 1):
        alone = int8.products(copy, xq[t:t + 1], xd[t:t + 1], xs[t:t + 1])
        np.testing.assert_array_equal(alone[0], together[t], f"{kind}: row {t} of {t_count} differs from itself alone")


def test_matmul_int8_rejects_a_mismatched_input():
    w, *_ = random_matrix("q4", 32, 64, np.random.default_rng(0))
    with pytest.raises(ValueError, match=r"expects \[T, 64\]"):
        int8.matmul_int8(np.zeros((1, 32), np.float32), w)


_DISPATCH = """
import numpy as np
from llmrs_core.backends.numba_backend import NumbaBackend
from llmrs_core.kernels.cpu.int8 import int8_unavailable
b = NumbaBackend(threads=1)
print(repr(int8_unavailable()))
print(b.describe())
"""


def _dispatch(cpu: str) -> list[str]:
    env = {**os.environ, "NUMBA_CPU_NAME": cpu, "NUMBA_CPU_FEATURES": ""}
    run = subprocess.run([sys.executable, "-c", _DISPATCH], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    return run.stdout.strip().splitlines()


@pytest.mark.skipif(os.uname().machine not in ("x86_64", "AMD64"), reason="the int8 kernels are x86 code")
def test_dispatch_follows_numbas_target():
    """generic has no AVX2: the backend must keep the float kernels there (and never compile the int8 ones)."""
    reason, described = _dispatch("generic")
    assert "avx2" in reason and "NUMBA_CPU_NAME=generic" in reason, reason
    assert "decode: float kernels" in described, described
    import llvmlite.binding as llvm

    if not llvm.get_host_cpu_features().get("avx2", False):
        pytest.skip("this CPU lacks AVX2: code compiled for haswell cannot run here")
    reason, described = _dispatch("haswell")
    assert reason == "None", f"haswell has AVX2, yet: {reason}"
    assert "decode: int8 (avx2)" in described, f"haswell has AVX2 but no VNNI: {described}"


_SAME_PRODUCTS = """
import sys
import numpy as np
from llmrs_core.kernels.cpu import int8
from llmrs_core.kernels.cpu.packing import pack_affine_q4, pack_q8
rng = np.random.default_rng(7)
x = rng.standard_normal((13, 256)).astype(np.float32)  # tiles of 8 with VNNI (AVX-512), of 4 as haswell
d8, d16 = rng.random((37, 8), np.float32), rng.random((37, 16), np.float32)
copies = [int8.int8_rows(pack_affine_q4(rng.integers(0, 16, (37, 256), dtype=np.uint8), d8, d8, "Q4_1")),
          int8.int8_rows(pack_q8(rng.integers(-128, 128, (37, 256)).astype(np.int8), d8, "Q8_0")),
          int8.int8_rows(pack_q8(rng.integers(-16, 16, (37, 256)).astype(np.int8), d8, "Q5_0")),
          int8.int8_rows_planes(rng.integers(-32, 32, (37, 256)).astype(np.int8),
                                (d8[:, :1], rng.integers(-128, 128, (37, 16)).astype(np.int8)), "Q6_K", "q8_k"),
          int8.int8_rows_unsigned(rng.integers(0, 32, (37, 256)).astype(np.uint8), d8, d8, "Q5_K")]
np.save(sys.argv[1], np.stack([int8.matmul_int8(x, w) for w in copies]))
print(int8.int8_instructions())
"""


@needs_int8
def test_vnni_and_avx2_products_are_the_same_numbers(tmp_path):
    """vpdpbusd and vpmaddubsw + vpmaddwd leave the same int32 lanes (no pair saturates), and the
    float arithmetic after them is the same: the two branches must agree bit for bit (the AVX-512
    side also takes its activation rows in tiles of eight, the haswell side in tiles of four)."""
    import llvmlite.binding as llvm

    if not llvm.get_host_cpu_features().get("avx2", False):
        pytest.skip("this CPU lacks AVX2: code compiled for haswell cannot run here")
    if int8.int8_instructions() != "avx512-vnni":  # decided before two 10-second compilations
        pytest.skip(f"Numba's target here has no AVX-512 VNNI ({int8.int8_instructions()}): one branch only")
    results = {}
    for name, env in (("this target", {}), ("haswell", {"NUMBA_CPU_NAME": "haswell", "NUMBA_CPU_FEATURES": ""})):
        out = tmp_path / f"{len(results)}.npy"
        run = subprocess.run([sys.executable, "-c", _SAME_PRODUCTS, str(out)], env={**os.environ, **env},
                             capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr
        results[name] = (run.stdout.strip(), np.load(out))
    assert results["haswell"][0] == "avx2", results["haswell"][0]
    if results["this target"][0] != "avx512-vnni":
        pytest.skip(f"Numba's target here has no AVX-512 VNNI ({results['this target'][0]}): one branch only")
    np.testing.assert_array_equal(results["this target"][1], results["haswell"][1],
                                  "the VNNI kernels' products differ from the AVX2 kernels'")


@needs_int8
def test_the_backend_sends_every_step_to_the_int8_kernels(tmp_path):
    """On the int8 path every product of a matrix with an int8 copy is the int8 kernel's, for a
    decode step and a step longer than kmatmul.INT8_ROWS alike (no BLAS: batch invariance);
    fused parts read the whole's rows; exact=True makes no copies."""
    import llmrs_core as llmrs
    from llmrs_core.kernels.cpu import matmul as kmatmul
    from llmrs_core.testing import write_tiny_llama

    path = tmp_path / "tiny.gguf"
    write_tiny_llama(path, weight_type="q4_1", seed=3, hidden_size=64, intermediate_size=128, n_heads=4,
                     n_kv_heads=2)
    net = llmrs.load(path, backend="numba").network
    layer, backend = net.layers[0], net.backend
    rng = np.random.default_rng(0)
    x = rng.standard_normal((kmatmul.INT8_ROWS + 9, 64)).astype(np.float32)
    w = layer.w_gate
    for rows in (1, 5, kmatmul.INT8_ROWS, x.shape[0]):
        backend.begin_step(rows, (rows,))
        np.testing.assert_array_equal(backend.matmul(x[:rows], w.fused), int8.matmul_int8(x[:rows], w.fused.int8),
                                      f"a step of {rows} rows must take the int8 kernels")
    backend.begin_step(1, (1,))
    gate, up = backend.matmul_many(x[:1], [layer.w_gate, layer.w_up])
    np.testing.assert_array_equal(gate, backend.matmul(x[:1], layer.w_gate))
    np.testing.assert_array_equal(up, int8.matmul_int8(x[:1], layer.w_up.int8))
    exact = llmrs.load(path, backend="numba", exact=True)
    assert exact.network.layers[0].wq.int8 is None, "with exact=True no int8 copies are made"
    assert "decode: float kernels (exact=True)" in exact.backend_report(), exact.backend_report()


def test_exact_is_the_float_path_on_every_backend():
    """exact=True asks for float32 products: the numpy backend computes them anyway and accepts it."""
    from llmrs_core.backends import get_backend

    assert get_backend("numpy", exact=True).name == "numpy"


@needs_int8
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_a_non_finite_activation_makes_its_products_non_finite(bad):
    """Damaged weights upstream show as NaN or inf in x: quantising must not round them into
    finite int8 codes, or the model's check of the logits never sees them."""
    w, *_ = random_matrix("q4", 8, 64, np.random.default_rng(0))
    x = np.ones((2, 64), np.float32)
    x[0, 40] = bad  # block 1 of row 0, after finite values in that block
    xq, xd, xs = int8.quantize_q8_1(x)
    assert not np.isfinite(xd[0, 1]) and np.isfinite(xd[0, 0]) and np.isfinite(xd[1]).all()
    out = int8.matmul_int8(x, w)
    assert not np.isfinite(out[0]).any(), "a NaN or inf activation vanished in the int8 products"
    assert np.isfinite(out[1]).all()


@needs_int8
def test_a_request_computes_the_same_numbers_batched_as_alone(tmp_path):
    """Every row takes the int8 kernels and every query the Numba attention kernel, whatever the
    step holds: sequences batched into one step, one of them longer than kmatmul.INT8_ROWS
    (where the path once switched to BLAS), get exactly the logits they get alone."""
    import llmrs_core as llmrs
    from llmrs_core.kernels.cpu import matmul as kmatmul
    from llmrs_core.testing import write_tiny_llama

    path = tmp_path / "tiny.gguf"
    most = kmatmul.INT8_ROWS
    write_tiny_llama(path, weight_type="q4_1", seed=5, hidden_size=64, intermediate_size=128, n_heads=4,
                     n_kv_heads=2, context_length=2 * most)
    net = llmrs.load(path, backend="numba").network
    rng = np.random.default_rng(1)
    sizes = (most - 10, most // 2 - 7, most + 20)
    short = [rng.integers(0, 64, n).tolist() for n in sizes]
    alone = [net.forward(ids, net.new_cache(len(ids)), last_only=False) for ids in short]
    batched = net.forward_batch([(ids, net.new_cache(len(ids))) for ids in short], last_only=False)
    for i, (got, want) in enumerate(zip(batched, alone)):
        np.testing.assert_array_equal(got, want, f"sequence {i} batched with the others differs from it alone")


@needs_int8
def test_fused_parts_keep_their_types_form():
    """Q, K and V fused into one matrix: the parts' copies are stacked (the products of the whole are
    the parts' side by side); Q6_K and Q3_K parts (one packed shape, two copy forms) are not fused."""
    from llmrs_core.kernels.cpu.packing import fuse, pack_raw
    from llmrs_core.quant import registry
    from llmrs_core.quant.types import GGMLType

    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 256)).astype(np.float32)

    def raw(ggml_type):
        return registry.quantizer(ggml_type)(rng.standard_normal((32, 256)).astype(np.float32)).reshape(-1)

    raws = [raw(GGMLType.Q6_K), raw(GGMLType.Q6_K)]
    copies = [int8.int8_rows_from_blocks(r, "Q6_K", (32, 256)) for r in raws]
    whole = int8.Int8Rows.stack(copies)
    assert (whole.kind, whole.variant, whole.rows) == ("q4h", "Q6_K", 64)
    alone = np.concatenate([int8.matmul_int8(x, c) for c in copies], axis=1)
    np.testing.assert_array_equal(int8.matmul_int8(x, whole), alone)
    mixed = [pack_raw(raws[0], GGMLType.Q6_K, (32, 256)), pack_raw(raw(GGMLType.Q3_K), GGMLType.Q3_K, (32, 256))]
    assert fuse(mixed) is None


@needs_int8
def test_q4_k_copy_from_the_files_bytes_keeps_its_integer_scales():
    """A Q4_K matrix's copy made from its bytes (``"q4k"``: 19 bytes per 32 weights) keeps the 6-bit
    scales and minimums as integers, applied in int32 per super-block as ggml applies them; the
    ``"q4"`` copy of the same matrix (24 bytes: ``d sc`` and ``-dmin mn`` as float32 per block) is the
    same matrix in the float arithmetic. Both must be the exact product to float32 rounding (a
    scale applied to the wrong block, or a minimum's sign, moves them by far more), and a copy cut
    into parts and stacked again must give the same bits."""
    from llmrs_core.kernels.cpu.packing import pack_raw
    from llmrs_core.quant import registry
    from llmrs_core.quant.types import GGMLType

    rng = np.random.default_rng(11)
    rows, cols = 72, 512
    raw = registry.quantizer(GGMLType.Q4_K)(rng.standard_normal((rows, cols)).astype(np.float32)).reshape(-1)
    q4 = int8.int8_rows(pack_raw(raw, GGMLType.Q4_K, (rows, cols)))
    q4k = int8.int8_rows_q4_k(raw, (rows, cols))
    assert q4k.kind == "q4k" and q4k.nbytes * 24 == q4.nbytes * 19
    for a, b in zip(q4k.row_major(), q4.row_major()):
        np.testing.assert_array_equal(a, b)
    codes, d, m = q4.row_major()
    codes = np.concatenate([codes.reshape(rows, -1, 16) & 15, codes.reshape(rows, -1, 16) >> 4], -1).reshape(rows, cols)
    for t_count in (1, 5, 17):
        x = rng.standard_normal((t_count, cols)).astype(np.float32)
        terms = block_terms(codes, d, m, *quantize_activations(x, "q8_k", 32))
        for copy in (q4k, q4):
            off = np.abs(int8.matmul_int8(x, copy) - terms.sum(axis=(-2, -1)))
            assert (off <= rounding_bound(terms)).all(), f"{copy.kind}, {t_count} rows: off by {off.max():.3g}"
    halves = int8.Int8Rows.stack([q4k.row_slice(0, 32), q4k.row_slice(32, rows)])
    np.testing.assert_array_equal(int8.matmul_int8(x, halves), int8.matmul_int8(x, q4k))


@needs_int8
def test_fused_parts_of_two_forms_take_the_form_both_fit(tmp_path):
    """Qwen2.5's Q4_K_M file fuses Q5_0 q and k with a Q8_0 v: the whole takes the 8-bit form both
    fit (one product), not the float kernels, and gives the numbers of the parts alone."""
    import llmrs_core as llmrs
    from llmrs_core.formats.gguf_writer import TensorToWrite, write_gguf
    from llmrs_core.quant.ggml_blocks import quantize
    from llmrs_core.quant.types import GGMLType
    from llmrs_core.testing import TINY_LLAMA, tiny_llama_metadata, tiny_llama_tensors

    params = {**TINY_LLAMA, "hidden_size": 64, "intermediate_size": 128, "n_heads": 4, "n_kv_heads": 2}
    tensors = tiny_llama_tensors(**params, seed=4)
    for name, a in list(tensors.items()):
        if a.ndim == 2:
            t = GGMLType.Q8_0 if name.endswith("attn_v.weight") else GGMLType.Q5_0
            tensors[name] = TensorToWrite(a.shape, t, quantize(a, t).tobytes())
    path = tmp_path / "mixed.gguf"
    write_gguf(path, tiny_llama_metadata(**params), tensors)
    net = llmrs.load(path, backend="numba").network
    layer = net.layers[0]
    assert layer.wq.fused is not None and layer.wq.int8 is not None and layer.wq.int8.kind == "q8"
    x = np.random.default_rng(0).standard_normal((3, 64)).astype(np.float32)
    net.backend.begin_step(3, (3,))
    q, k, v = net.backend.matmul_many(x, [layer.wq, layer.wk, layer.wv])
    np.testing.assert_array_equal(v, int8.matmul_int8(x, layer.wv.int8))
    assert np.isfinite(q).all() and q.shape == (3, 64) and k.shape == (3, 32)
