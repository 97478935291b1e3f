"""Every GPU kernel against the engine's NumPy reference, on tiny random shapes (chapter 9).

Inputs are drawn fresh per test, outputs are filled with NaN before the launch (a thread
that writes nothing leaves a NaN), and tolerances come from the arithmetic
(``float32_tolerance``). In the simulator each launch takes about a tenth of a second to a
second: shapes stay at K of 64-128 and a few dozen rows.
"""

from __future__ import annotations

import numpy as np
import pytest

from llmrs_core import attention as ref_attention
from llmrs_core import layers, rope
from llmrs_core.kernels.gpu import attention, elementwise, matvec, sampling
from llmrs_core.kernels.gpu.arrays import launch, to_device, to_host, xp
from llmrs_core.kv_cache.paged import PagedKVCache
from llmrs_core.kv_cache.paged import paged_attention as ref_paged_attention
from llmrs_core.quant.dequant import dequantize
from llmrs_core.quant.ggml_blocks import quantize
from llmrs_core.quant.types import GGMLType
from llmrs_core.sampling import SamplingParams, sample_token
from llmrs_core.testing import float32_tolerance, normalised_error, tiny_llama_config


def poisoned(shape: tuple[int, ...]):
    out = xp().empty(shape, np.float32)
    out[...] = np.nan
    return out


def assert_close(got, want, tol: float, what: str) -> None:
    got = to_host(got)
    assert np.isfinite(got).all(), f"{what}: NaN left in the output (a thread wrote nothing)"
    err = normalised_error(got, want)
    assert err <= tol, f"{what}: normalised error {err:.2e} > {tol:.2e}"


@pytest.mark.parametrize("ggml_type", [GGMLType.Q4_1, GGMLType.Q8_0])
@pytest.mark.parametrize(("rows", "cols", "tokens"), [(40, 64, 1), (19, 128, 3)])
def test_fused_matvec_matches_dequantised_product(ggml_type, rows, cols, tokens):
    rng = np.random.default_rng()
    raw = quantize(rng.standard_normal((rows, cols)).astype(np.float32), ggml_type)
    dense = dequantize(raw, ggml_type, (rows, cols)).astype(np.float64)
    x = rng.standard_normal((tokens, cols)).astype(np.float32)
    w = matvec.pack(raw, ggml_type, (rows, cols))
    out = matvec.matvec(to_device(x), w, poisoned((tokens, rows)))
    assert_close(out, x @ dense.T, float32_tolerance(cols), f"{ggml_type.name} matvec")


def test_matvec_is_right_for_any_launch_geometry():
    """The kernels stride over rows and tokens: one block of one lane is slow, but right."""
    rng = np.random.default_rng()
    rows, cols = 7, 64
    raw = quantize(rng.standard_normal((rows, cols)).astype(np.float32), GGMLType.Q4_1)
    dense = dequantize(raw, GGMLType.Q4_1, (rows, cols)).astype(np.float64)
    x = rng.standard_normal((2, cols)).astype(np.float32)
    w = matvec.pack(raw, GGMLType.Q4_1, (rows, cols))
    out = poisoned((2, rows))
    launch(matvec.q4_1_matvec_kernel, (1, 1), (1, 3), w.qs, w.d, w.m, to_device(x), out)
    assert_close(out, x @ dense.T, float32_tolerance(cols), "Q4_1 matvec on a (1, 1) x (1, 3) launch")


def test_f32_matvec_and_dense_fallback():
    rng = np.random.default_rng()
    dense = rng.standard_normal((24, 96)).astype(np.float32)
    x = rng.standard_normal((2, 96)).astype(np.float32)
    w = matvec.pack(None, None, dense.shape, dense=dense)
    out = matvec.matvec(to_device(x), w, poisoned((2, 24)))
    assert_close(out, x.astype(np.float64) @ dense.T.astype(np.float64), float32_tolerance(96), "f32 matvec")
    ids = np.array([5, 0, 23])
    np.testing.assert_array_equal(to_host(matvec.embed(w, ids, poisoned((3, 96)))), dense[ids])


@pytest.mark.parametrize("ggml_type", [GGMLType.Q4_1, GGMLType.Q8_0])
def test_dequantise_and_embed_are_the_reference_dequantiser(ggml_type):
    rng = np.random.default_rng()
    rows, cols = 12, 64
    raw = quantize(rng.standard_normal((rows, cols)).astype(np.float32), ggml_type)
    want = dequantize(raw, ggml_type, (rows, cols))
    w = matvec.pack(raw, ggml_type, (rows, cols))
    dense = to_host(matvec.dequantize_into(w, poisoned((rows, cols))))
    np.testing.assert_array_equal(dense, want, err_msg="d * q + m in float32 is exact: must equal the dequantiser")
    ids = np.array([3, 0, 11, 3])
    rows_out = to_host(matvec.embed(w, ids, poisoned((4, cols))))
    np.testing.assert_array_equal(rows_out, want[ids])


def test_matvec_rejects_a_wrong_width():
    raw = quantize(np.ones((4, 64), np.float32), GGMLType.Q8_0)
    w = matvec.pack(raw, GGMLType.Q8_0, (4, 64))
    with pytest.raises(ValueError, match=r"x must be \[T, 64\]"):
        matvec.matvec(to_device(np.ones((1, 32), np.float32)), w)
    with pytest.raises(ValueError, match="truncated or mislabelled"):
        matvec.pack(raw[:-34], GGMLType.Q8_0, (4, 64))


def test_rms_norm():
    rng = np.random.default_rng()
    x = (3 * rng.standard_normal((3, 96))).astype(np.float32)
    weight = rng.standard_normal(96).astype(np.float32)
    out = elementwise.rms_norm_rows(to_device(x), to_device(weight), 1e-5, poisoned(x.shape))
    assert_close(out, layers.rms_norm(x, weight, 1e-5), float32_tolerance(96), "RMSNorm")


@pytest.mark.parametrize("interleaved", [True, False])
def test_rope(interleaved):
    rng = np.random.default_rng()
    x = rng.standard_normal((3, 2, 16)).astype(np.float32)
    positions = np.array([0, 7, 300])
    want = (rope.apply_rope_interleaved if interleaved else rope.apply_rope_half)(x, positions, 10000.0)
    out = elementwise.rope_rotate(to_device(x), positions, 10000.0, interleaved, poisoned(x.shape))
    # two products and a sum per output from the same cos/sin: a few roundings
    assert_close(out, want, float32_tolerance(2), f"RoPE ({'interleaved' if interleaved else 'half'})")


def test_swiglu_and_residual_add():
    rng = np.random.default_rng()
    gate = (4 * rng.standard_normal((3, 40))).astype(np.float32)
    up = rng.standard_normal((3, 40)).astype(np.float32)
    out = elementwise.swiglu_rows(to_device(gate), to_device(up), poisoned(gate.shape))
    # tanh (a few ulp on a GPU), then four products and sums
    assert_close(out, layers.swiglu(gate, up), float32_tolerance(8), "SwiGLU")
    added = to_host(elementwise.add_rows(to_device(gate), to_device(up), poisoned(gate.shape)))
    np.testing.assert_array_equal(added, gate + up)


def _paged_pool(rng, lengths: list[int], block_size: int = 4):
    """A real engine PagedKVCache (one layer) holding random K/V for sequences of ``lengths``."""
    config = tiny_llama_config(hidden_size=64, n_layers=1, n_heads=4, n_kv_heads=2)  # head_dim 16
    cache = PagedKVCache(config, num_blocks=16, block_size=block_size)
    for s, n in enumerate(lengths):
        cache.add_sequence(s)
        for _ in range(n):  # one token at a time: the blocks of the sequences interleave in the pool
            cache.reserve(s, 1)
            k, v = rng.standard_normal((2, 1, 2, 16)).astype(np.float32)
            cache.write(0, s, k, v)
            cache.advance(s, 1)
    return cache


@pytest.mark.parametrize("tq", [1, 3])
def test_paged_decode_attention_over_block_tables(tq):
    rng = np.random.default_rng()
    cache = _paged_pool(rng, [9, 5, 13])
    k_pool, v_pool = to_device(cache.k[0]), to_device(cache.v[0])
    for s, n in cache.lengths.items():
        q = rng.standard_normal((tq, 4, 16)).astype(np.float32)
        want = ref_paged_attention(q, cache.k[0], cache.v[0], cache.tables[s], n)
        out = attention.paged_attention(to_device(q), k_pool, v_pool, cache.tables[s], n, poisoned(q.shape))
        assert_close(out, want, float32_tolerance(max(n, 16), depth=2), f"paged attention, sequence {s} ({n} tokens)")


@pytest.mark.parametrize(("tq", "tk"), [(11, 11), (4, 13)])
def test_tiled_prefill_attention(tq, tk):
    rng = np.random.default_rng()
    q = rng.standard_normal((tq, 4, 16)).astype(np.float32)
    k, v = rng.standard_normal((2, tk, 2, 16)).astype(np.float32)
    want = ref_attention.scaled_dot_product_attention(q, k, v, causal=True)
    out = attention.contiguous_attention(to_device(q), to_device(k), to_device(v), poisoned(q.shape))
    assert_close(out, want, float32_tolerance(max(tk, 16), depth=2), f"prefill attention {tq}x{tk}")


def test_prefill_attention_across_several_tiles():
    """More queries than one tile (32): tiles of keys are loaded and rescaled one after another."""
    rng = np.random.default_rng()
    q = rng.standard_normal((34, 1, 16)).astype(np.float32)
    k, v = rng.standard_normal((2, 34, 1, 16)).astype(np.float32)
    want = ref_attention.scaled_dot_product_attention(q, k, v, causal=True)
    out = attention.contiguous_attention(to_device(q), to_device(k), to_device(v), poisoned(q.shape))
    assert_close(out, want, float32_tolerance(34, depth=2), "prefill attention over two tiles")


def test_attention_rejects_bad_shapes():
    q = to_device(np.zeros((1, 3, 16), np.float32))
    k = to_device(np.zeros((4, 2, 16), np.float32))
    with pytest.raises(ValueError, match="cannot share"):
        attention.contiguous_attention(q, k, k)
    with pytest.raises(ValueError, match="exceeds"):
        attention.paged_attention(to_device(np.zeros((1, 2, 16), np.float32)),
                                  to_device(np.zeros((2, 2, 4, 16), np.float32)),
                                  to_device(np.zeros((2, 2, 4, 16), np.float32)), [0], 5)


def test_greedy_argmax_on_the_device():
    rng = np.random.default_rng()
    logits = rng.standard_normal((3, 300)).astype(np.float32)
    logits[1, [17, 250]] = logits[1].max() + 1  # a tie: numpy.argmax takes the first
    got = sampling.greedy(to_device(logits))
    np.testing.assert_array_equal(got, np.argmax(logits, axis=1))
    assert sampling.greedy(to_device(logits[2]))[0] == np.argmax(logits[2])


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0.8, seed=1),
    SamplingParams(temperature=1.2, top_k=20, seed=2),
    SamplingParams(temperature=0.7, top_p=0.9, seed=3),
    SamplingParams(temperature=1.0, top_k=50, top_p=0.8, min_p=0.05, seed=4),
    SamplingParams(temperature=0.9, repetition_penalty=1.3, presence_penalty=0.5, frequency_penalty=0.2, seed=5),
    SamplingParams(temperature=0.0, repetition_penalty=1.5, seed=6),  # greedy after penalties
])
def test_sampling_chain_on_the_device_gives_the_host_samplers_tokens(params):
    rng = np.random.default_rng()
    history = [int(i) for i in rng.integers(0, 300, 12)]
    host_rng, device_rng = np.random.default_rng(params.seed), np.random.default_rng(params.seed)
    host, device = [], []
    for _ in range(8):
        logits = (2 * rng.standard_normal(300)).astype(np.float32)
        host.append(sample_token(logits, params, host_rng, history))
        device.append(sampling.sample(to_device(logits), params, device_rng, history))
    assert device == host, f"{params}: device {device}, host {host}"


def test_int8_q4_1_matvec_is_llama_cpps_q8_1_arithmetic():
    """x quantised to 8 bits exactly as ggml's Q8_0/Q8_1 (codes and scale), then integer dot products."""
    from llmrs_core.kernels.gpu import matvec_int8

    rng = np.random.default_rng()
    rows, cols, tokens = 10, 96, 2
    raw = quantize(rng.standard_normal((rows, cols)).astype(np.float32), GGMLType.Q4_1)
    x = rng.standard_normal((tokens, cols)).astype(np.float32)
    xq, xd, xs = (to_host(a) for a in matvec_int8.quantize_activations(to_device(x)))
    ggml = quantize(x, GGMLType.Q8_0).reshape(tokens, -1, 34)  # the engine's ggml-exact Q8_0 of x
    np.testing.assert_array_equal(xq.reshape(tokens, -1, 32), ggml[:, :, 2:].view(np.int8), "Q8 codes differ from ggml's")
    np.testing.assert_array_equal(xd.astype(np.float16), ggml[:, :, :2].copy().view(np.float16)[..., 0])
    w = matvec.pack(raw, GGMLType.Q4_1, (rows, cols))
    got = to_host(matvec_int8.matvec_int8(to_device(x), w, poisoned((tokens, rows))))
    x_8bit = (xq.astype(np.float64).reshape(tokens, -1, 32) * xd[..., None]).reshape(tokens, cols)
    dense = dequantize(raw, GGMLType.Q4_1, (rows, cols)).astype(np.float64)
    assert_close(got, x_8bit @ dense.T, float32_tolerance(cols), "int8 matvec against the Q8 activations")
    # against float x: each activation moved by at most half its block's step d_x / 2, so row r is off
    # by at most sum_k |w_rk| d_x(k) / 2 (plus float32 rounding)
    half_step = np.repeat(xd / 2, 32, axis=1).astype(np.float64)  # [T, K]
    bound = half_step @ np.abs(dense).T
    off = np.abs(got - x.astype(np.float64) @ dense.T)
    assert (off <= bound * (1 + 1e-6) + float32_tolerance(cols) * np.abs(got).max()).all()


def test_stacked_matrices_are_their_parts():
    """Q, K and V stacked into one matrix: one launch, and each part's rows are its own product."""
    rng = np.random.default_rng()
    sizes, cols = (8, 4, 4), 64
    raws = [quantize(rng.standard_normal((r, cols)).astype(np.float32), GGMLType.Q4_1) for r in sizes]
    parts = matvec.stack([matvec.pack(raw, GGMLType.Q4_1, (r, cols)) for raw, r in zip(raws, sizes)])
    assert parts is not None and all(p.fused is parts[0].fused for p in parts)
    x = rng.standard_normal((2, cols)).astype(np.float32)
    whole = to_host(matvec.matvec(to_device(x), parts[0].fused, poisoned((2, sum(sizes)))))
    for part, raw, r in zip(parts, raws, sizes):
        want = x.astype(np.float64) @ dequantize(raw, GGMLType.Q4_1, (r, cols)).T.astype(np.float64)
        assert_close(whole[:, part.first_row : part.first_row + r], want, float32_tolerance(cols), "stacked rows")
        assert_close(matvec.matvec(to_device(x), part, poisoned((2, r))), want, float32_tolerance(cols), "a part alone")
    assert matvec.stack([parts[0], matvec.pack(None, None, (4, 32), dense=np.ones((4, 32), np.float32))]) is None
