"""The quantisation types real files use (issue 28): the type table, the codecs, the refusal.

References, none written here:

* ggml's type ids and block sizes: ``ggml.h`` / ``ggml.c`` of llama.cpp as vendored in
  llama-cpp-python 0.3.36, and the installed ``gguf`` package's ``GGML_QUANT_SIZES``;
* ggml's quantisers: ``scripts/make_quant_mixes.py`` ran ggml's own functions
  (``quantize_row_*_ref``, ``quantize_iq4_nl/xs`` as ``llama_model_quantize`` calls them
  without an importance matrix, ``ggml_fp32_to_bf16_row_ref``) from llama-cpp-python's
  ``libggml-base`` on ``quant_cases.py``'s inputs and stored sha256 digests of the bytes
  (``tests/golden/quant_mixes/golden.json``, ``ggml_digests``);
* dequantisation: ``gguf.quants.dequantize`` (llama.cpp's gguf-py), on any bytes.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from llmrs_core.config import ConfigError
from llmrs_core.formats.gguf import read_gguf
from llmrs_core.formats.gguf_writer import TensorToWrite, write_gguf
from llmrs_core.quant import registry
from llmrs_core.quant.types import TYPE_TRAITS, GGMLType, type_traits
from llmrs_core.testing import tiny_llama_metadata, tiny_llama_tensors
from tests.core.quant_cases import CASE_NAMES, make_case

gguf = pytest.importorskip("gguf", reason="the gguf package is the test-time reference")

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "quant_mixes"
DIGESTS = json.loads((GOLDEN / "golden.json").read_text())["ggml_digests"]

#: the types this issue adds (chapter 6's are tested in test_kquants.py / test_quant_blocks.py)
NEW_TYPES = ("Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q5_K", "IQ4_NL", "IQ4_XS", "BF16")

#: enum ggml_type in ggml.h (llama.cpp vendored in llama-cpp-python 0.3.36)
GGML_H_IDS = {
    "F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q5_1": 7, "Q8_0": 8, "Q8_1": 9, "Q2_K": 10,
    "Q3_K": 11, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14, "Q8_K": 15, "IQ2_XXS": 16, "IQ2_XS": 17, "IQ3_XXS": 18,
    "IQ1_S": 19, "IQ4_NL": 20, "IQ3_S": 21, "IQ2_S": 22, "IQ4_XS": 23, "I8": 24, "I16": 25, "I32": 26,
    "I64": 27, "F64": 28, "IQ1_M": 29, "BF16": 30, "TQ1_0": 34, "TQ2_0": 35, "MXFP4": 39, "NVFP4": 40,
    "Q1_0": 41, "Q2_0": 42,
}


def digest(raw: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(raw).tobytes()).hexdigest()[:24]


# -- the type table -------------------------------------------------------------


def test_every_ggml_type_id_is_known_by_name():
    assert {t.name: t.value for t in GGMLType} == GGML_H_IDS
    assert set(TYPE_TRAITS) == set(GGMLType), "every type needs a block size and a size"


def test_sizes_match_gguf_py():
    sizes = gguf.constants.GGML_QUANT_SIZES
    checked = 0
    for qtype, (block, size) in sizes.items():
        # gguf 0.19 still says 40 for Q8_1 (fixed to 36 in the gguf-py llama.cpp vendors now)
        if qtype.name in GGMLType.__members__ and qtype.name != "Q8_1":
            assert (type_traits(GGMLType[qtype.name]).block_size, type_traits(GGMLType[qtype.name]).type_size) \
                == (block, size), qtype.name
            checked += 1
    assert checked >= 25  # gguf 0.19 knows 33 of the 34 others (not Q8_1); older versions fewer


def test_q8_1_is_ggmls_36_bytes():
    # ggml-common.h's block_q8_1: fp16 d, fp16 s, 32 int8 (40 here before, as in gguf 0.19:
    # d and s were float32 once)
    assert (type_traits(GGMLType.Q8_1).block_size, type_traits(GGMLType.Q8_1).type_size) == (32, 36)


@pytest.mark.parametrize("removed", [4, 5, 31, 32, 33, 36, 37, 38, 43])
def test_removed_or_unknown_ids_are_refused_with_the_list(removed):
    with pytest.raises(ValueError, match=rf"unknown ggml tensor type id {removed} .*IQ2_XXS=16"):
        type_traits(removed)


# -- the codecs against ggml ----------------------------------------------------


@pytest.mark.parametrize("type_name", DIGESTS["normal"])
@pytest.mark.parametrize("case", CASE_NAMES)
def test_quantiser_is_bit_exact_with_ggml(case, type_name):
    x = make_case(case)
    raw = registry.quantizer(GGMLType[type_name])(x)
    traits = type_traits(GGMLType[type_name])
    assert raw.dtype == np.uint8 and raw.shape == (x.shape[0], x.shape[1] // traits.block_size * traits.type_size)
    assert digest(raw) == DIGESTS[case][type_name], f"{type_name} bytes differ from ggml's on case {case!r}"


#: byte offset of each fp16 scale field in a block (random bits there could be NaN/inf)
SCALE_FIELDS = {"Q5_0": (0,), "Q5_1": (0, 2), "Q2_K": (80, 82), "Q3_K": (108,), "Q5_K": (0, 2),
                "IQ4_NL": (0,), "IQ4_XS": (0,)}


@pytest.mark.parametrize("type_name", NEW_TYPES)
def test_dequantiser_decodes_any_bytes_as_gguf_does(type_name):
    t = GGMLType[type_name]
    size = type_traits(t).type_size
    rng = np.random.default_rng(3)
    raw = rng.integers(0, 256, (300, size), dtype=np.uint8)
    for at in SCALE_FIELDS.get(type_name, ()):
        raw[:, at:at + 2] = rng.standard_normal(300).astype("<f2").view(np.uint8).reshape(300, 2)
    ours = registry.dequantizer(t)(raw)
    theirs = gguf.quants.dequantize(raw.reshape(-1), gguf.GGMLQuantizationType[type_name]).reshape(-1)
    assert ours.dtype == np.float32
    np.testing.assert_array_equal(ours.view(np.uint32), np.asarray(theirs, np.float32).view(np.uint32))


def test_bf16_rounds_to_nearest_even_and_keeps_nan_quiet():
    bits = np.array([0x7F800001, 0xFFC00001, 0x7FFFFFFF, 0x7F800000, 0xFF800000, 0x3F808000, 0x3F818000,
                     0x3F807FFF, 0x00000001, 0x80000000, 0x7F7FFFFF], np.uint32)
    ours = registry.quantizer(GGMLType.BF16)(bits.view(np.float32)).view("<u2")
    # a signalling NaN becomes quiet (bit 6 of the top half); ties go to even; the largest
    # finite float32 rounds up to infinity, as ggml_compute_fp32_to_bf16 does
    want = [0x7FC0, 0xFFC0, 0x7FFF, 0x7F80, 0xFF80, 0x3F80, 0x3F82, 0x3F80, 0x0000, 0x8000, 0x7F80]
    assert ours.tolist() == want
    assert ours.tolist() == gguf.quants.quantize(bits.view(np.float32), gguf.GGMLQuantizationType.BF16) \
        .view("<u2").tolist()


@pytest.mark.parametrize("type_name", [t for t in NEW_TYPES if t != "BF16"])
def test_quantisers_refuse_partial_blocks(type_name):
    t = GGMLType[type_name]
    block = type_traits(t).block_size
    with pytest.raises(ValueError, match=rf"{block}"):
        registry.quantizer(t)(np.ones((2, block + 16), np.float32))
    with pytest.raises(ValueError, match=rf"{type_traits(t).type_size}"):
        registry.dequantizer(t)(np.zeros(type_traits(t).type_size + 1, np.uint8))


@pytest.mark.parametrize("type_name", [t for t in NEW_TYPES if t != "BF16"])
def test_round_trip_error_is_that_of_the_grid(type_name):
    # RMSE / std of a Gaussian row: the grid step over the +-3 sigma a block spans, / sqrt(12),
    # e.g. 6/31/sqrt(12) = 0.056 for 5 bits; the fits get under it (measured 0.036-0.30)
    bound = {"Q5_0": 0.06, "Q5_1": 0.06, "Q5_K": 0.045, "Q3_K": 0.2, "Q2_K": 0.35, "IQ4_NL": 0.1, "IQ4_XS": 0.1}
    x = make_case("uniform")
    y = registry.dequantizer(GGMLType[type_name])(registry.quantizer(GGMLType[type_name])(x)).reshape(x.shape)
    assert np.sqrt(np.mean((y - x) ** 2)) / x.std() < bound[type_name]


# -- refusing what cannot be computed, listing it -------------------------------


def write_model_with(path: Path, odd: dict[str, GGMLType]) -> Path:
    """A tiny Llama (rows of 256) whose tensors in ``odd`` are stored as random bytes of those types."""
    params = dict(hidden_size=256, intermediate_size=256, n_layers=1, n_heads=4, n_kv_heads=2, vocab_size=64,
                  context_length=64, rope_theta=10000.0, rms_norm_eps=1e-5)
    tensors: dict = tiny_llama_tensors(**params)
    rng = np.random.default_rng(0)
    for name, t in odd.items():
        shape = tensors[name].shape
        n = shape[0] * shape[1] // type_traits(t).block_size * type_traits(t).type_size
        tensors[name] = TensorToWrite(shape, t, rng.integers(0, 256, n, dtype=np.uint8).tobytes())
    write_gguf(path, tiny_llama_metadata(**params), tensors)
    return path


def test_check_computable_names_tensor_type_and_supported_types(tmp_path):
    path = write_model_with(tmp_path / "iq2.gguf",
                            {"blk.0.ffn_down.weight": GGMLType.IQ2_XXS, "blk.0.attn_q.weight": GGMLType.TQ2_0})
    source = read_gguf(path)  # the file opens: every type is known by its size
    with pytest.raises(ConfigError) as err:
        registry.check_computable(source)
    message = str(err.value)
    assert str(path) in message
    assert "blk.0.ffn_down.weight (IQ2_XXS)" in message and "blk.0.attn_q.weight (TQ2_0)" in message
    assert "supported types: " in message and "Q4_K" in message and "IQ4_XS" in message
    # only the tensors the caller will read are judged
    registry.check_computable(source, [n for n in source.tensors if n.endswith("norm.weight")])


def test_check_computable_passes_every_supported_type(tmp_path):
    odd = {"blk.0.ffn_down.weight": GGMLType.Q5_K, "blk.0.attn_q.weight": GGMLType.IQ4_XS,
           "blk.0.attn_k.weight": GGMLType.Q2_K}
    registry.check_computable(read_gguf(write_model_with(tmp_path / "ok.gguf", odd)))


def test_llmrs_info_lists_types_it_cannot_compute(tmp_path, capsys):
    from llmrs_core.cli import main

    path = write_model_with(tmp_path / "iq2.gguf", {"blk.0.ffn_down.weight": GGMLType.IQ2_XXS})
    assert main(["info", str(path)]) == 0
    out = capsys.readouterr().out
    assert "1 IQ2_XXS" in out and "F32" in out


def test_loading_a_type_the_engine_cannot_compute_is_refused_naming_the_tensor(tmp_path):
    """``llmrs info`` opens the file; computing with it (the weights' first use) is refused
    before any weight is read, naming the tensor, its type and the supported types."""
    import llmrs_core as llmrs
    from llmrs_core.config import ConfigError

    path = write_model_with(tmp_path / "iq2.gguf", {"blk.0.ffn_down.weight": GGMLType.IQ2_XXS})
    model = llmrs.load(path, backend="numpy")
    with pytest.raises(ConfigError, match=r"blk\.0\.ffn_down\.weight \(IQ2_XXS\).*supported types: .*Q4_K"):
        _ = model.network
