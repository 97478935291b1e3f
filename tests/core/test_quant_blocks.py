"""GGML block quantisation (Q8_0, Q4_0, Q4_1), bit-exact with llama.cpp's gguf-py; multiplying
from blocks; requantising whole models; byte-identical GGUF round trips."""

from __future__ import annotations

import numpy as np
import pytest

import llmrs_core as llmrs
from llmrs_core.formats.gguf import read_gguf
from llmrs_core.formats.gguf_writer import TensorToWrite, write_gguf
from llmrs_core.quant.dequant import dequantize
from llmrs_core.quant.ggml_blocks import matvec, quantize
from llmrs_core.quant.requantize import requantize_gguf
from llmrs_core.quant.types import GGMLType
from llmrs_core.testing import float32_tolerance, write_tiny_llama

gguf = pytest.importorskip("gguf", reason="gguf-py is the test-time reference")

TYPES = [GGMLType.Q8_0, GGMLType.Q4_0, GGMLType.Q4_1]


def distributions():
    rng = np.random.default_rng(2026)
    yield "normal", rng.standard_normal((96, 256)).astype(np.float32)
    yield "heavy tails", (rng.standard_normal((96, 256)) ** 3).astype(np.float32)
    yield "uniform", rng.uniform(-3, 3, (32, 128)).astype(np.float32)
    yield "all zero", np.zeros((4, 64), np.float32)
    yield "constant", np.full((4, 64), -0.7, np.float32)
    yield "tiny", rng.uniform(-1e-7, 1e-7, (8, 64)).astype(np.float32)
    yield "exact halves", (np.round(rng.standard_normal((32, 64)) * 8) / 2).astype(np.float32)
    yield "one-sided", np.abs(rng.standard_normal((16, 64))).astype(np.float32)


@pytest.mark.parametrize("gtype", TYPES, ids=lambda t: t.name)
def test_quantise_bit_exact_with_gguf_py(gtype):
    for name, x in distributions():
        ours = quantize(x, gtype)
        theirs = gguf.quants.quantize(x, gguf.GGMLQuantizationType(int(gtype)))
        assert np.array_equal(ours, theirs), f"{gtype.name}, {name}: bytes differ from gguf-py"
        back = dequantize(ours.reshape(-1), gtype, x.shape)
        want = gguf.quants.dequantize(theirs, gguf.GGMLQuantizationType(int(gtype)))
        assert np.array_equal(back, want), f"{gtype.name}, {name}: dequantised values differ"


@pytest.mark.parametrize("gtype", TYPES, ids=lambda t: t.name)
def test_reconstruction_error_is_bounded(gtype):
    x = np.random.default_rng(1).standard_normal((64, 256)).astype(np.float32)
    err = dequantize(quantize(x, gtype).reshape(-1), gtype, x.shape) - x
    rel = np.sqrt(np.mean(err**2)) / x.std()
    bound = {GGMLType.Q8_0: 0.01, GGMLType.Q4_0: 0.15, GGMLType.Q4_1: 0.1}[gtype]
    assert rel < bound, f"{gtype.name}: relative RMS error {rel:.3f}"


def test_quantise_rejects_bad_input():
    with pytest.raises(ValueError, match="multiple of 32"):
        quantize(np.zeros((2, 33), np.float32), GGMLType.Q8_0)
    with pytest.raises(ValueError, match="NaN"):
        quantize(np.full(32, np.nan, np.float32), GGMLType.Q4_0)
    with pytest.raises(ValueError, match="unknown weight format"):
        quantize(np.zeros(32, np.float32), "q3_banana")


@pytest.mark.parametrize("gtype", TYPES, ids=lambda t: t.name)
def test_matvec_from_blocks_equals_dequantise_then_multiply(gtype):
    rng = np.random.default_rng(3)
    w = rng.standard_normal((300, 192)).astype(np.float32)
    raw = quantize(w, gtype)
    dense = dequantize(raw.reshape(-1), gtype, w.shape)
    for x in (rng.standard_normal(192).astype(np.float32), rng.standard_normal((192, 3)).astype(np.float32)):
        want = dense @ x  # float32 sums of 192 terms, in BLAS's order: relative to the largest output
        atol = float32_tolerance(192) * np.abs(want).max()
        np.testing.assert_allclose(matvec(raw, gtype, w.shape, x, rows_per_chunk=64), want, rtol=0, atol=atol)


def test_gguf_round_trip_is_byte_identical(tmp_path):
    src, dst = tmp_path / "a.gguf", tmp_path / "b.gguf"
    write_tiny_llama(src)
    with read_gguf(src) as g:
        tensors = [(n, TensorToWrite(i.shape, i.ggml_type, g.tensor_bytes(n).tobytes())) for n, i in g.tensors.items()]
        write_gguf(dst, g.fields, tensors)
    assert src.read_bytes() == dst.read_bytes()


@pytest.mark.parametrize("target", ["q8_0", "q4_0", "q4_1", "f16"])
def test_requantised_tiny_model_runs(tmp_path, target):
    src, dst = tmp_path / "f32.gguf", tmp_path / f"{target}.gguf"
    write_tiny_llama(src)
    counts = requantize_gguf(src, dst, target)
    assert counts[target.upper()] == 2 * 7 + 1  # 7 matrices per layer + the embedding
    ref = llmrs.load(src).logits([1, 2, 3, 4])
    got = llmrs.load(dst).logits([1, 2, 3, 4])
    rel = np.abs(got - ref).max() / np.abs(ref).max()
    assert rel < {"q8_0": 0.05, "f16": 0.002, "q4_0": 0.6, "q4_1": 0.6}[target], f"{target}: relative error {rel:.3f}"
    with read_gguf(src) as a, read_gguf(dst) as b:
        assert set(a.metadata) <= set(b.metadata) | {"general.file_type"}
        assert b.metadata["general.file_type"] == {"q8_0": 7, "q4_0": 2, "q4_1": 3, "f16": 1}[target]
    reader = gguf.GGUFReader(str(dst))  # llama.cpp's own reader accepts the file
    assert len(reader.tensors) == counts[target.upper()] + counts.get("F32", 0)


def test_requantise_refuses_bad_requests(tmp_path):
    src = tmp_path / "f32.gguf"
    write_tiny_llama(src)
    with pytest.raises(ValueError, match="unsupported target"):
        requantize_gguf(src, tmp_path / "x.gguf", "q2_k")
    with pytest.raises(ValueError, match="different file"):
        requantize_gguf(src, src, "q8_0")


@pytest.mark.parametrize("target, bound", [("q4_k", 0.3), ("q6_k", 0.1)])
def test_requantise_to_k_quants(tmp_path, target, bound):
    """Rows of 256 take the K-quant super-blocks; SmolLM2's 576-wide rows fall back to Q8_0."""
    src, dst = tmp_path / "f32.gguf", tmp_path / f"{target}.gguf"
    write_tiny_llama(src, hidden_size=256, intermediate_size=512, n_heads=4, n_kv_heads=2)
    counts = requantize_gguf(src, dst, target)
    assert counts[target.upper()] == 2 * 7 + 1
    ref = llmrs.load(src).logits([1, 2, 3, 4])
    got = llmrs.load(dst).logits([1, 2, 3, 4])
    rel = np.linalg.norm(got - ref) / np.linalg.norm(ref)
    assert rel < bound, f"{target}: relative error of the logits {rel:.3f}"
    narrow = tmp_path / "narrow.gguf"
    write_tiny_llama(narrow)  # hidden size 32: no row fits a 256-value super-block
    counts = requantize_gguf(narrow, tmp_path / "narrow-k.gguf", target)
    assert target.upper() not in counts and counts["Q8_0"] == 2 * 7 + 1


@pytest.mark.model
def test_requantising_smollm2_reproduces_llamacpps_bytes(smollm2_gguf):
    """The file's Q4_1 matrices and Q8_0 embedding were written by llama.cpp's quantiser:
    quantising their dequantised values again must give the very same bytes."""
    names = ["token_embd.weight", "blk.0.attn_q.weight", "blk.7.ffn_down.weight", "blk.29.ffn_up.weight"]
    for name in names:
        info = smollm2_gguf.tensors[name]
        values = dequantize(smollm2_gguf.tensor_bytes(name), info.ggml_type, info.shape)
        again = quantize(values, info.ggml_type).reshape(-1)
        assert np.array_equal(again, smollm2_gguf.tensor_bytes(name)), name
