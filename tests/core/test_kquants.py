"""Q4_K and Q6_K (llmrs_core.quant.kquants), checked bit for bit against ggml.

Dequantising is compared directly with ``gguf.quants.dequantize``. The
``gguf`` package cannot *quantise* the K-quants (0.19 raises
``NotImplementedError``), so quantising is checked against SHA-256 digests of
what ggml's own ``quantize_row_q4_K_ref`` / ``quantize_row_q6_K_ref`` write
for the same inputs (ggml-quants.c as vendored in llama-cpp-python 0.3.36,
built for x86-64 without fused multiply-add, as llama.cpp builds ggml-base
there). Should a later ``gguf`` learn to quantise them, the bytes are
compared with it as well.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from llmrs_core.quant.kquants import dequantize_q4_k, dequantize_q6_k, quantize_q4_k, quantize_q6_k
from tests.core.quant_cases import make_case

gguf = pytest.importorskip("gguf", reason="the gguf package is the test-time reference")
from gguf import GGMLQuantizationType  # noqa: E402

KINDS = {
    "Q4_K": (quantize_q4_k, dequantize_q4_k, GGMLQuantizationType.Q4_K, 144),
    "Q6_K": (quantize_q6_k, dequantize_q6_k, GGMLQuantizationType.Q6_K, 210),
}

# Reconstruction error RMSE / std that each format stays below. A 4-bit grid
# over a 32-value Gaussian sub-block spans about 4 sigma in 15 steps, so its
# rounding error is about (4/15)/sqrt(12) = 0.077 sigma; the least-squares
# search gets a little under that. Two more bits make the grid 4x finer.
ERROR_BOUND = {"Q4_K": 0.08, "Q6_K": 0.02}



# sha256(quantised bytes)[:24] of ggml's reference quantiser on make_case(name)
CASES: dict[str, dict[str, str]] = {
    "normal": {"Q4_K": "fe8d79640dbeec849f992a45", "Q6_K": "0ff497cb3d5ce12849ea4b7b"},
    "uniform": {"Q4_K": "8a3f51dd39d7d5f09c607475", "Q6_K": "341bd3e78d9ba0e624456049"},
    "outliers": {"Q4_K": "5381e55c02cc5e026d7c20d8", "Q6_K": "69137cbf0df3a0656d14f621"},
    "heavy_tailed": {"Q4_K": "6f6a04d86e33c393773d2312", "Q6_K": "0a2200af2966d0c446c1e2ba"},
    "positive": {"Q4_K": "a85f616afb527f0e4379769b", "Q6_K": "6d4b4bc0e17e6e0da0b1167a"},
    "negative": {"Q4_K": "0c38795f893963d20bc74447", "Q6_K": "8509b20cb77c44ef38b2d118"},
    "mixed_scales": {"Q4_K": "0780ed8fbeba652f8f502a28", "Q6_K": "74133f5702e521107495533a"},
    "zero_sub_blocks": {"Q4_K": "4841d68997b0887cd046cf1d", "Q6_K": "f416caed568cba4b5eed844e"},
    "sparse": {"Q4_K": "5f9fd6327264afdd93424e22", "Q6_K": "b51cbf9cd6b3acbcb02d56da"},
    "integers": {"Q4_K": "f4e1ecdf7fca2bfa82b4d027", "Q6_K": "13f4393546fe622df6ea4817"},
    "tiny": {"Q4_K": "521b4c17fd50bdc8f4a1531b", "Q6_K": "461f60cfe2faaf3e1734403c"},
    "underflow": {"Q4_K": "3adf57284a3f5016ddb089ac", "Q6_K": "03eb0169a130e809dcea508a"},
    "all_zero": {"Q4_K": "4cf9816ed1062189ff0c8d42", "Q6_K": "065cc6b2b996ca729f6aa020"},
    "constant": {"Q4_K": "928eb77457aa466e90602198", "Q6_K": "6f8ceeec0a0d1ce3573d0541"},
}

# The same for the real ffn_down weights of SmolLM2's first layer (rows of 1536;
# SmolLM2's other matrices have rows of 576, not a whole number of super-blocks).
MODEL_TENSOR = "blk.0.ffn_down.weight"
MODEL_DIGESTS = {"Q4_K": "7a46652ed272410d01ed18e5", "Q6_K": "1d8054fa97a5b0a307b99113"}


def digest(raw: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(raw).tobytes()).hexdigest()[:24]


def gguf_quantize(x: np.ndarray, qtype: GGMLQuantizationType) -> np.ndarray | None:
    """gguf's quantisation of ``x``, or None while gguf cannot quantise this type."""
    try:
        return gguf.quants.quantize(x, qtype)
    except NotImplementedError:
        return None


def assert_same_bits(ours: np.ndarray, theirs: np.ndarray) -> None:
    """Equal as float32 bit patterns (so -0.0 != 0.0 and NaN == NaN)."""
    ours = np.ascontiguousarray(ours, dtype=np.float32).reshape(-1)
    theirs = np.ascontiguousarray(theirs, dtype=np.float32).reshape(-1)
    assert ours.shape == theirs.shape
    assert np.array_equal(ours.view(np.uint32), theirs.view(np.uint32))


def check_against_references(x: np.ndarray, kind: str, want_digest: str) -> np.ndarray:
    quantize, dequantize, qtype, block_bytes = KINDS[kind]
    raw = quantize(x)
    assert raw.dtype == np.uint8
    assert raw.shape == (*x.shape[:-1], x.shape[-1] // 256 * block_bytes)
    assert digest(raw) == want_digest, f"{kind} bytes differ from ggml's reference quantiser"
    theirs = gguf_quantize(x, qtype)
    if theirs is not None:
        np.testing.assert_array_equal(raw, theirs)
    y = dequantize(raw)
    assert y.dtype == np.float32 and y.shape == (x.size,)
    assert_same_bits(y, gguf.quants.dequantize(raw, qtype))
    return y


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("case", CASES)
def test_bit_exact_with_ggml(case: str, kind: str) -> None:
    check_against_references(make_case(case), kind, CASES[case][kind])


@pytest.mark.parametrize("kind", KINDS)
def test_dequantize_any_bytes_like_gguf(kind: str) -> None:
    """Random blocks (finite fp16 scales, every other bit random) decode exactly as gguf decodes them."""
    _, dequantize, qtype, block_bytes = KINDS[kind]
    rng = np.random.default_rng(7)
    raw = rng.integers(0, 256, (300, block_bytes), dtype=np.uint8)
    scales = rng.standard_normal((300, 2)).astype(np.float16).view(np.uint8)
    if kind == "Q4_K":
        raw[:, 0:4] = scales  # d, dmin
    else:
        raw[:, 208:210] = scales[:, 0:2]  # d
    assert_same_bits(dequantize(raw), gguf.quants.dequantize(raw, qtype))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("case", ["normal", "uniform"])
def test_reconstruction_error_is_small(case: str, kind: str) -> None:
    quantize, dequantize, _, _ = KINDS[kind]
    x = make_case(case)
    y = dequantize(quantize(x)).reshape(x.shape)
    assert np.sqrt(np.mean((y - x) ** 2)) / x.std() < ERROR_BOUND[kind]


@pytest.mark.parametrize("kind", KINDS)
def test_shapes(kind: str) -> None:
    quantize, dequantize, _, block_bytes = KINDS[kind]
    x = make_case("normal")[:6].reshape(3, 2, 512)
    raw = quantize(x)
    assert raw.shape == (3, 2, 2 * block_bytes)
    # the bytes do not depend on how the rows are arranged, nor on the input dtype
    np.testing.assert_array_equal(raw.reshape(-1), quantize(x.reshape(-1)))
    np.testing.assert_array_equal(raw, quantize(x.astype(np.float64)))
    np.testing.assert_array_equal(quantize(x[:, :, ::-1])[0, 0], quantize(x[0, 0, ::-1].copy()))
    assert dequantize(raw).shape == (x.size,)
    assert quantize(np.zeros((5, 0), np.float32)).shape == (5, 0)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("shape", [(100,), (3, 255), (2, 257), (512, 100)])
def test_quantize_rejects_partial_super_blocks(kind: str, shape: tuple[int, ...]) -> None:
    quantize = KINDS[kind][0]
    with pytest.raises(ValueError, match=rf"{kind}.*multiple of 256.*{shape[-1]}"):
        quantize(np.ones(shape, np.float32))


@pytest.mark.parametrize("kind", KINDS)
def test_quantize_rejects_a_scalar(kind: str) -> None:
    with pytest.raises(ValueError, match="multiple of 256"):
        KINDS[kind][0](np.float32(1.0))


@pytest.mark.parametrize("kind", KINDS)
def test_dequantize_rejects_partial_blocks(kind: str) -> None:
    _, dequantize, _, block_bytes = KINDS[kind]
    with pytest.raises(ValueError, match=rf"{block_bytes + 1} bytes.*{kind}.*{block_bytes} bytes"):
        dequantize(np.zeros(block_bytes + 1, np.uint8))


@pytest.mark.model
@pytest.mark.parametrize("kind", KINDS)
def test_bit_exact_on_real_weights(model_path, kind: str) -> None:
    from llmrs_core import read_gguf
    from llmrs_core.quant import dequantize_tensor

    with read_gguf(model_path) as g:
        w = dequantize_tensor(g, MODEL_TENSOR)
    assert w.shape == (576, 1536)
    y = check_against_references(w, kind, MODEL_DIGESTS[kind]).reshape(w.shape)
    # these weights are already on Q4_1's 4-bit grids (32 values each, aligned with
    # Q4_K's sub-blocks), so both formats reproduce them closely
    assert np.sqrt(np.mean((y - w) ** 2)) / w.std() < ERROR_BOUND[kind]
