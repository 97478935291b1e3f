"""Exercise 10.6 — Building a Model Loader.

References: the `safetensors` package (files it writes, values it reads) and the
engine's GGUF path (a model exported to Hugging Face layout must load back to
the same weights).
"""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from llmrs_core.formats.gguf import read_gguf
from llmrs_core.formats.hf import export_hf
from llmrs_core.quant import dequantize_all
from llmrs_core.testing import write_tiny_llama

st = pytest.importorskip("safetensors.numpy")

TENSORS = {
    "a.weight": np.arange(12, dtype=np.float32).reshape(3, 4),
    "b.bias": np.linspace(0, 1, 5).astype(np.float16),
    "c.ids": np.array([7, 8, 9], dtype=np.int64),
}


@pytest.fixture
def reference_file(tmp_path):
    path = tmp_path / "ref.safetensors"
    st.save_file(TENSORS, str(path), metadata={"format": "pt"})
    return path


def test_ex10_6_read_header(ex, reference_file):
    header, data_offset = ex.read_safetensors_header(reference_file)
    raw = reference_file.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    assert data_offset == 8 + n, "the data starts right after the 8-byte length and the JSON header"
    assert header == json.loads(raw[8 : 8 + n]), "return the header JSON as parsed"
    assert header["__metadata__"] == {"format": "pt"}
    assert header["a.weight"]["shape"] == [3, 4] and header["a.weight"]["dtype"] == "F32"


def test_ex10_6_load_safetensors_matches_the_reference(ex, reference_file):
    got = ex.load_safetensors(reference_file)
    want = st.load_file(str(reference_file))
    assert set(got) == set(want), "every tensor, and no __metadata__ entry"
    for name in want:
        assert got[name].dtype == want[name].dtype and got[name].shape == want[name].shape, name
        np.testing.assert_array_equal(got[name], want[name])


def test_ex10_6_bf16_becomes_float32(ex, tmp_path):
    bits = np.array([0x3F80, 0xC020, 0x4049], dtype=np.uint16)  # 1.0, -2.5, 3.140625
    header = json.dumps({"x": {"dtype": "BF16", "shape": [3], "data_offsets": [0, 6]}}).encode()
    path = tmp_path / "bf16.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header + bits.tobytes())
    got = ex.load_safetensors(path)["x"]
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, [1.0, -2.5, 3.140625])


def test_ex10_6_malformed_files_raise(ex, tmp_path):
    path = tmp_path / "bad.safetensors"
    path.write_bytes(struct.pack("<Q", 10**9) + b"{}")
    with pytest.raises(ValueError):
        ex.read_safetensors_header(path)
    header = json.dumps({"x": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header + bytes(8))
    with pytest.raises(ValueError):
        ex.load_safetensors(path)


@pytest.mark.parametrize(
    "hf, gguf",
    [
        ("model.embed_tokens.weight", "token_embd.weight"),
        ("model.norm.weight", "output_norm.weight"),
        ("lm_head.weight", "output.weight"),
        ("model.layers.0.input_layernorm.weight", "blk.0.attn_norm.weight"),
        ("model.layers.12.self_attn.q_proj.weight", "blk.12.attn_q.weight"),
        ("model.layers.3.self_attn.o_proj.weight", "blk.3.attn_output.weight"),
        ("model.layers.29.post_attention_layernorm.weight", "blk.29.ffn_norm.weight"),
        ("model.layers.7.mlp.down_proj.weight", "blk.7.ffn_down.weight"),
        ("model.layers.0.self_attn.rotary_emb.inv_freq", None),
    ],
)
def test_ex10_6_names(ex, hf, gguf):
    assert ex.hf_to_gguf_name(hf) == gguf


@pytest.mark.parametrize("tied", [True, False])
def test_ex10_6_hf_directory_loads_back_to_the_gguf_weights(ex, tmp_path, tied):
    src = tmp_path / "tiny.gguf"
    write_tiny_llama(src, tie_embeddings=tied, seed=2)
    export_hf(src, tmp_path / "hf")  # un-permutes W_q / W_k into Hugging Face's order
    with read_gguf(src) as g:
        want = dequantize_all(g)
    got = ex.load_hf_weights(tmp_path / "hf", permute_qk=True)
    assert set(got) == set(want)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=f"{name} (did you permute W_q and W_k?)")
    raw = ex.load_hf_weights(tmp_path / "hf", permute_qk=False)
    assert not np.array_equal(raw["blk.0.attn_q.weight"], want["blk.0.attn_q.weight"]), (
        "without permute_qk the rows stay in Hugging Face's order"
    )
