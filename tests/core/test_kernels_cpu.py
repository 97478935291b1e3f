"""The Numba CPU kernels and backend (chapter 8) against the NumPy reference.

Float paths must agree to a normalised error (max |ours - reference| / max
|reference|) of ``float32_tolerance(K)``, K the longest sum (about
sqrt(K) * 2^-24, times a safety factor; times sqrt(layers) for a model): the
kernels change the order of float sums, nothing else, and that order is the
CPU's (8 lanes with AVX2, 16 with AVX-512, 4 and no FMA on a generic x86-64).
The model-level checks run a tiny quantised model written here; the real
SmolLM2 checks are in test_model_golden.py (both backends).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numba import njit

import llmrs_core as llmrs
from llmrs_core import attention as reference_attention
from llmrs_core import layers, rope
from llmrs_core.kernels.cpu import matmul as km
from llmrs_core.kernels.cpu import ops
from llmrs_core.kernels.cpu.inspect import assembly, instruction_mix, packed_fma_unavailable, vector_summary
from llmrs_core.kernels.cpu.packing import LANES, fuse, pack_float, pack_raw
from llmrs_core.kernels.cpu.threads import (
    BlasThreads,
    load_pip_tbb,
    max_threads,
    set_threads,
    threading_layer,
)
from llmrs_core.quant.dequant import dequantize
from llmrs_core.quant.ggml_blocks import quantize
from llmrs_core.quant.types import GGMLType
from llmrs_core.testing import float32_tolerance, normalised_error, write_tiny_llama

TYPES = ["Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q6_K"]
K_QUANTS = ("Q4_K", "Q6_K")  # 256-weight super-blocks


def packed_random(ggml_type: str, rows: int, cols: int, seed: int = 0):
    """A random ``[rows, cols]`` matrix stored as ``ggml_type``: (packed, its float32 values)."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((rows, cols)).astype(np.float32)
    t = GGMLType[ggml_type]
    raw = quantize(w, t)
    return pack_raw(raw, t, (rows, cols)), dequantize(raw, t, (rows, cols))


@pytest.mark.parametrize("ggml_type", TYPES)
@pytest.mark.parametrize("rows", [64, 40])  # 40: not a whole number of 32-row groups
def test_packing_keeps_every_weight(ggml_type, rows):
    cols = 512 if ggml_type in K_QUANTS else 96
    w, want = packed_random(ggml_type, rows, cols)
    assert w.kind == ("q8" if ggml_type in ("Q8_0", "Q6_K") else "q4") and w.shape == (rows, cols)
    assert w.qs.shape[0] * LANES >= rows
    got = km.dequantize_rows(w, 0, rows)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6 * np.abs(want).max())


@pytest.mark.parametrize("ggml_type", TYPES)
@pytest.mark.parametrize("t_count", [1, 3, km.ROWS_AS_MATVECS + 1, km.SMALL_BATCH, km.SMALL_BATCH + 1, 40])
def test_matmul_matches_the_dequantised_product(ggml_type, t_count):
    """Every path — matvec (T=1), small batch, dequantise + BLAS — against x @ W.T in float32."""
    cols = 256 if ggml_type in K_QUANTS else 96
    w, dense = packed_random(ggml_type, 72, cols, seed=t_count)
    x = np.random.default_rng(1).standard_normal((t_count, cols)).astype(np.float32)
    got = km.matmul(x, w)
    want = (x.astype(np.float64) @ dense.T.astype(np.float64)).astype(np.float32)
    assert got.shape == (t_count, 72) and got.dtype == np.float32
    assert normalised_error(got, want) <= float32_tolerance(cols)


def test_matmul_bands_and_scratch(monkeypatch):
    """Prompt processing in several bands of rows, with and without a reused scratch buffer."""
    monkeypatch.setattr(km, "BAND_ROWS", 64)
    w, dense = packed_random("Q4_1", 200, 64)
    x = np.random.default_rng(2).standard_normal((20, 64)).astype(np.float32)
    want = x @ dense.T
    assert normalised_error(km.matmul(x, w), want) <= float32_tolerance(64)
    scratch = np.full((64, 64), np.nan, np.float32)
    assert normalised_error(km.matmul(x, w, scratch), want) <= float32_tolerance(64)


def test_matmul_rejects_a_mismatched_input():
    w, _ = packed_random("Q4_1", 32, 64)
    with pytest.raises(ValueError, match=r"x has shape \(2, 63\), the weight expects \[T, 64\]"):
        km.matmul(np.zeros((2, 63), np.float32), w)


def test_packing_a_truncated_tensor_names_the_problem():
    raw = quantize(np.ones((4, 64), np.float32), GGMLType.Q4_1)
    with pytest.raises(ValueError, match=r"a \[4, 64\] Q4_1 matrix is 160 bytes; got 157"):
        pack_raw(raw.reshape(-1)[:-3], GGMLType.Q4_1, (4, 64))


def test_types_without_a_kernel_are_not_packed():
    assert pack_raw(np.zeros(64 * 4, np.uint8), GGMLType.F32, (4, 16)) is None


def test_fused_matrices_give_the_same_products():
    a, da = packed_random("Q4_1", 64, 64, seed=1)
    b, db = packed_random("Q4_1", 32, 64, seed=2)
    parts = fuse([a, b])
    assert parts is not None and parts[0].fused is parts[1].fused and parts[0].fused.rows == 96
    x = np.random.default_rng(3).standard_normal((1, 64)).astype(np.float32)
    whole = km.matmul(x, parts[0].fused)
    np.testing.assert_array_equal(whole[:, :64], km.matmul(x, parts[0]))
    assert normalised_error(whole[:, 64:], x @ db.T) <= float32_tolerance(64)
    # parts that cannot share a kernel stay apart
    assert fuse([a, packed_random("Q8_0", 32, 64)[0]]) is None
    assert fuse([packed_random("Q4_1", 40, 64)[0], b]) is None
    assert fuse([pack_float(np.ones((32, 64)), "F32"), pack_float(np.ones((32, 64)), "F32")]) is None


def test_rms_norm_and_rope_match_the_reference():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((5, 48)).astype(np.float32)
    w = rng.standard_normal(48).astype(np.float32)
    assert normalised_error(ops.rms_norm(x, w, np.float32(1e-5)), layers.rms_norm(x, w, 1e-5)) <= float32_tolerance(48)
    q = rng.standard_normal((5, 3, 16)).astype(np.float32)
    pos = np.array([0, 1, 7, 300, 4096])
    cos, sin = ops.rope_tables(pos, rope.rope_frequencies(16, 1e5))
    # each output is x0 cos - x1 sin: a sum of 2 (the angles, up to 4096 rad, are float64 on both sides)
    assert normalised_error(ops.rope(q, cos, sin, True), rope.apply_rope_interleaved(q, pos, 1e5)) <= float32_tolerance(2)
    assert normalised_error(ops.rope(q, cos, sin, False), rope.apply_rope_half(q, pos, 1e5)) <= float32_tolerance(2)


@njit(cache=True)
def _exp32_all(x):
    out = np.empty_like(x)
    for i in range(x.size):
        out[i] = ops.exp32(x[i])
    return out


def test_exp32_is_within_one_unit_in_the_last_place():
    """The softmax's and SwiGLU's vectorised ``exp`` against float64's, over float32's whole range:
    Cephes' polynomial keeps it within 1 ulp (a wrong coefficient, or a rounding step fused away,
    is thousands); NaN stays NaN, overflow is inf, underflow 0."""
    x = np.concatenate([np.linspace(-87.3, 88.3, 1_000_001, dtype=np.float32),
                        np.random.default_rng(3).standard_normal(10_000).astype(np.float32)])
    want = np.exp(x.astype(np.float64))
    ulps = np.abs(_exp32_all(x) - want) / np.spacing(want.astype(np.float32)).astype(np.float64)
    assert ulps.max() <= 1.0, f"exp32 is {ulps.max():.1f} ulp off at x = {x[np.argmax(ulps)]}"
    special = np.float32([np.nan, np.inf, -np.inf, 0.0, 89.0, -88.0, -1000.0])
    got = _exp32_all(special)
    assert np.isnan(got[0]) and got[1] == np.inf and got[4] == np.inf, got
    np.testing.assert_array_equal(got[[2, 3, 5, 6]], np.float32([0, 1, 0, 0]))


@pytest.mark.parametrize("tq,tk", [(1, 1), (1, 37), (5, 5), (16, 40), (40, 40), (130, 200)])
def test_attention_kernels_match_the_reference(tq, tk):
    rng = np.random.default_rng(tq * 1000 + tk)
    q = rng.standard_normal((tq, 6, 16)).astype(np.float32)
    # keys and values as the contiguous cache hands them over: [Hkv, T, D] seen as [T, Hkv, D]
    k = rng.standard_normal((2, tk, 16)).astype(np.float32).transpose(1, 0, 2)
    v = rng.standard_normal((2, tk, 16)).astype(np.float32).transpose(1, 0, 2)
    want = reference_attention.scaled_dot_product_attention(q, k, v, causal=True)
    # sums of D = 16 products (scores of order 1 here) and of Tk weighted values
    tolerance = float32_tolerance(max(16, tk))
    assert normalised_error(ops.attention(q, k, v, *ops.NO_OPTIONS), want) <= tolerance
    for chunk in (128, 7):
        assert normalised_error(ops.attention_prefill(q, k, v, chunk=chunk), want) <= tolerance


@njit
def _weighted_rows(w, w_at, m, start, stride, count, width, out, at):
    ops._add_weighted_rows(w, w_at, 0, m, start, stride, count, width, out, at, 0)


@njit
def _weighted_rows_4(w, w_at, w_stride, m, start, stride, count, width, out, at, out_stride):
    ops._add_weighted_rows_4(w, w_at, w_stride, m, start, stride, count, width, out, at, out_stride)


@pytest.mark.parametrize("width", [7, 16, 64, 80, 136])  # 64-wide blocks, then eight, then one at a time
def test_weighted_rows_are_summed_term_by_term_in_float32(width):
    """Attention's two products (an IR kernel holding a block of outputs in registers) must give the
    bits of ``o[j] = o[j] + w[i] * m[i, j]`` term after term in float32 (no fused multiply-add, no
    reordering): the bits a prompt's query and a decode step's share. NumPy's float32 ``*`` and ``+``
    are exactly that; a wrong stride, start or offset, or a fused multiply-add, moves them."""
    rng = np.random.default_rng(width)
    rows, count, stride, first = 40, 29, width + 5, 6  # rows of m apart by more than the width read
    m = rng.standard_normal((rows * stride + width,)).astype(np.float32)
    w = rng.random(count + 10).astype(np.float32)  # entries outside [3, 3 + count) must not be read
    out = rng.standard_normal((2, 4, width)).astype(np.float32)
    want = out.copy()
    for i in range(count):
        start = (first + i) * stride
        want[1, 2] = want[1, 2] + w[3 + i] * m[start:start + width]
    _weighted_rows(w, 3, m, first * stride, stride, count, width, out, (1 * 4 + 2) * width)
    np.testing.assert_array_equal(out.view(np.uint32), want.view(np.uint32))
    # four rows at once (four queries' scores): rows 0, 2, 4, 6 of w, into out rows 0, 2, 4, 6
    w4 = rng.random((7, count)).astype(np.float32)
    out4 = rng.standard_normal((7, width)).astype(np.float32)
    want4 = out4.copy()
    for r in range(0, 7, 2):
        for i in range(count):
            start = (first + i) * stride
            want4[r] = want4[r] + w4[r, i] * m[start:start + width]
    _weighted_rows_4(w4, 0, 2 * count, m, first * stride, stride, count, width, out4, 0, 2 * width)
    np.testing.assert_array_equal(out4.view(np.uint32), want4.view(np.uint32))


@given(n=st.integers(1, 600), threads=st.integers(2, 8))
@settings(max_examples=50, deadline=None)
def test_folded_query_order_visits_every_query_once_and_balances_the_threads(n, threads):
    """``attention`` takes the queries in ``_folded`` order so that equal runs of iterations (what
    ``prange`` gives each thread) hold equal causal work: every query exactly once, and each run's
    keys within one query's worth of the fair share (in order, the last run of two had 3/4)."""
    order = [ops._folded.py_func(i, n) for i in range(n)]
    assert sorted(order) == list(range(n))
    if n >= 4 * threads:
        work = np.array(order) + 1.0  # query t attends to t + 1 keys
        runs = [run.sum() for run in np.array_split(work, threads)]
        assert max(runs) - min(runs) <= 2 * n, runs


@pytest.mark.parametrize("options", [ops.NO_OPTIONS, (5, np.float32(0), np.float32(0)),
                                     (0, np.float32(3.0), np.float32(0.2))])
def test_a_prompts_query_and_a_decode_steps_give_the_same_bits(options):
    """From ``TRANSPOSE_QUERIES`` queries on, attention sums its scores across transposed keys, four
    queries at a time (``QUERY_TILE``; here three tiles and one query after them); a decode step's one
    query reads them in place. Both sum each score in the same order, so a
    query's output does not depend on how many came with it (the int8 path's batch invariance);
    with a window, a soft-cap and a scale too. A fastmath or reordered sum on either side fails this."""
    rng = np.random.default_rng(8)
    tq, tk = ops.TRANSPOSE_QUERIES + 5, 43
    q = rng.standard_normal((tq, 6, 24)).astype(np.float32)
    k = rng.standard_normal((tk, 2, 24)).astype(np.float32)
    v = rng.standard_normal((tk, 2, 24)).astype(np.float32)
    together = ops.attention(q, k, v, *options)
    for t in (0, tq // 2, tq - 1):  # query t alone sees the keys up to its own position
        alone = ops.attention(q[t:t + 1], k[:tk - tq + t + 1], v[:tk - tq + t + 1], *options)
        np.testing.assert_array_equal(alone[0], together[t], f"query {t} alone differs from query {t} among {tq}")


def test_threads_are_checked_and_reported():
    with pytest.raises(ValueError, match="threads must be between 1 and"):
        set_threads(max_threads() + 1)
    with pytest.raises(ValueError, match="threads must be between 1 and"):
        set_threads(0)
    assert set_threads(None) == max_threads()
    assert threading_layer() in ("omp", "tbb", "workqueue")
    blas = BlasThreads()
    with blas.limited(1):
        assert blas.current == 1
    assert "BLAS" in blas.describe() or blas.describe()


def test_results_do_not_depend_on_the_thread_count():
    w, _ = packed_random("Q4_1", 256, 128)
    x = np.random.default_rng(5).standard_normal((1, 128)).astype(np.float32)
    try:
        set_threads(1)
        one = km.matmul(x, w)
        set_threads(max_threads())
        many = km.matmul(x, w)
    finally:
        set_threads(None)
    np.testing.assert_array_equal(one, many)  # each row is summed by one thread, in one order


@pytest.mark.skipif(packed_fma_unavailable() is not None, reason=str(packed_fma_unavailable()))
def test_the_matvec_kernel_is_vectorised():
    """What LLVM emits for the decode kernel: packed multiply-adds on ymm/zmm registers."""
    w, _ = packed_random("Q4_1", 64, 64)
    asm = assembly(km.q4_matvec, w.qs, w.d, w.m, np.zeros(64, np.float32))
    summary = vector_summary(asm)
    assert summary["packed_fma"] > 0, f"no packed FMA in the kernel's assembly: {summary}"
    assert sum(instruction_mix(asm).values()) > 0


# -- the backend on a tiny quantised model ------------------------------------


@pytest.fixture(scope="module", params=["q4_1", "q8_0", "q4_0"])
def tiny_quantised(request, tmp_path_factory):
    path = tmp_path_factory.mktemp("tinyq") / f"tiny-{request.param}.gguf"
    # sizes that fill whole 32-row groups, so Q/K/V and gate/up are fused
    write_tiny_llama(path, weight_type=request.param, seed=3, hidden_size=64, intermediate_size=128,
                     n_heads=4, n_kv_heads=2)
    return path


def test_numba_backend_matches_numpy_on_a_quantised_model(tiny_quantised):
    ids = [1, 2, 3, 4, 5, 60, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20]
    want = llmrs.load(tiny_quantised, backend="numpy").logits(ids)
    model = llmrs.load(tiny_quantised, backend="numba", exact=True)  # the float kernels: float32's level
    assert model.network.layers[0].wq.fused is not None, "Q, K and V should share one kernel call"
    tolerance = float32_tolerance(model.network.config)  # the model's longest sum, through its layers
    assert normalised_error(model.logits(ids), want) <= tolerance
    # decode one token at a time, and a batch of sequences, give the same logits
    net = model.network
    cache = net.new_cache(len(ids))
    steps = [net.forward(ids[:3], cache)] + [net.forward([t], cache) for t in ids[3:]]
    assert normalised_error(np.concatenate(steps), want) <= tolerance
    caches = [net.new_cache(8) for _ in range(3)]
    batch = net.forward_batch([(ids[:4], caches[0]), (ids[:1], caches[1]), (ids[5:9], caches[2])])
    for got, seq in zip(batch, (ids[:4], ids[:1], ids[5:9])):
        assert normalised_error(got[0], net.forward(seq)[-1]) <= tolerance


def test_numba_backend_on_float_weights(tmp_path):
    """F32 files (and Hugging Face directories) go through BLAS: same answers as NumPy."""
    path = tmp_path / "tiny.gguf"
    write_tiny_llama(path, seed=4)
    ids = [5, 6, 7, 8]
    reference = llmrs.load(path, backend="numpy")
    want = reference.logits(ids)
    got = llmrs.load(path, backend="numba").logits(ids)
    assert normalised_error(got, want) <= float32_tolerance(reference.network.config)


def test_numba_is_the_default_and_reports_its_threads(tiny_quantised):
    model = llmrs.load(tiny_quantised, threads=1)
    try:
        assert model.backend_name == "numba"
        report = model.backend_report()
        assert "1 threads" in report and "layer" in report
    finally:
        set_threads(None)


def test_impossible_thread_counts_are_refused(tiny_quantised):
    with pytest.raises(ValueError, match="threads must be between 1 and"):
        llmrs.load(tiny_quantised, backend="numba", threads=10_000)
    with pytest.raises(ValueError, match="the numpy backend multiplies with BLAS"):
        llmrs.load(tiny_quantised, backend="numpy", threads=2)


def test_each_backend_runs_on_its_own_thread_count(tiny_quantised):
    import numba

    one = llmrs.load(tiny_quantised, backend="numba", threads=1)
    everything = llmrs.load(tiny_quantised, backend="numba")  # sets all threads, process-wide
    try:
        one.logits([1, 2])
        assert numba.get_num_threads() == 1, "a backend made with threads=1 must compute on 1 thread"
        everything.logits([1, 2])
        assert numba.get_num_threads() == max_threads()
    finally:
        set_threads(None)


def test_a_missing_or_broken_tbb_is_no_error(tmp_path, monkeypatch):
    monkeypatch.delenv("NUMBA_THREADING_LAYER", raising=False)
    assert load_pip_tbb(str(tmp_path)) is False  # no lib/libtbb.so.12
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "libtbb.so.12").write_bytes(b"not a shared library")
    assert load_pip_tbb(str(tmp_path)) is False
    monkeypatch.setenv("NUMBA_THREADING_LAYER", "omp")
    assert load_pip_tbb(str(tmp_path)) is False


def test_the_tbb_dependency_is_the_threading_layer(monkeypatch):
    """pyproject installs tbb on Linux x86-64 for its work stealing under contention (threads.py):
    where it is installed and no layer is forced, Numba must be running on it, not OpenMP."""
    import importlib.metadata
    import os
    import subprocess
    import sys

    try:
        importlib.metadata.version("tbb")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("tbb is not installed here (pyproject installs it on Linux x86-64 only)")
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_THREADING_LAYER"}
    code = "from llmrs_core.kernels.cpu.threads import threading_layer; print(threading_layer())"
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "tbb", f"tbb is installed, yet Numba's layer is {run.stdout.strip()!r}"
