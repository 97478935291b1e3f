"""Exercise 10.6 — Building a Model Loader.

References: the `safetensors` package (files it writes, values it reads) and the
engine's GGUF path (a model exported to Hugging Face layout must load back to
the same weights). The audit, one test per likely mistake: the data offset
without the 8-byte length; tensor offsets counted from the start of the file;
BF16 bits in the low half, or read as float16; W_q / W_k not permuted, permuted
the wrong way, or W_k permuted with the query heads' count.
"""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from llmrs_core.formats.gguf import read_gguf
from llmrs_core.formats.hf import export_hf
from llmrs_core.quant import dequantize_all
from llmrs_core.rope import permute_for_interleaved, unpermute_from_interleaved
from llmrs_core.testing import TINY_LLAMA, assert_matches, write_tiny_llama

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
    assert set(got) == set(want), f"every tensor, and no __metadata__ entry: yours {sorted(got)}, want {sorted(want)}"
    raw = reference_file.read_bytes()
    header = json.loads(raw[8 : 8 + struct.unpack("<Q", raw[:8])[0]])
    for name in want:
        assert got[name].dtype == want[name].dtype and got[name].shape == want[name].shape, (
            f"{name}: {got[name].dtype} {got[name].shape}, the file says {want[name].dtype} {want[name].shape}"
        )
        begin, end = header[name]["data_offsets"]
        from_file_start = np.frombuffer(raw[begin:end], dtype=want[name].dtype).reshape(want[name].shape)
        assert_matches(got[name].astype(np.float64), want[name].astype(np.float64),
                       [("read at data_offsets counted from the start of the file instead of from the data "
                         "section (which begins at 8 + N)", from_file_start.astype(np.float64))],
                       what=f"your {name}", axes=("index",) * want[name].ndim, tol=0.0)


def test_ex10_6_bf16_becomes_float32(ex, tmp_path):
    bits = np.array([0x3F80, 0xC020, 0x4049], dtype=np.uint16)  # 1.0, -2.5, 3.140625
    header = json.dumps({"x": {"dtype": "BF16", "shape": [3], "data_offsets": [0, 6]}}).encode()
    path = tmp_path / "bf16.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header + bits.tobytes())
    got = ex.load_safetensors(path)["x"]
    assert got.dtype == np.float32, f"BF16 comes back as float32, got {got.dtype}"
    assert_matches(got, np.array([1.0, -2.5, 3.140625]), [
        ("with the 16 bits as the low half of a float32: shift them into the top half (bits << 16)",
         bits.astype(np.uint32).view(np.float32)),
        ("read as float16: bfloat16 is not IEEE half precision (8 exponent bits, not 5)",
         bits.view(np.float16).astype(np.float32)),
    ], what="your BF16 tensor", axes=("element",), tol=0.0)


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
    got = ex.hf_to_gguf_name(hf)
    assert got == gguf, f"hf_to_gguf_name({hf!r}) is {got!r}; expected {gguf!r}" + (
        " (a tensor the engine does not use maps to None)" if gguf is None else "")


def permutation_variants(name: str, want: np.ndarray) -> list[tuple[str, np.ndarray]]:
    """``(description, weights)``: W_q / W_k as the known row-order mistakes leave them, from the
    GGUF weights ``want`` and the engine's permutations (Exercise 3.7's)."""
    heads = {"attn_q": TINY_LLAMA["n_heads"], "attn_k": TINY_LLAMA["n_kv_heads"]}.get(name.split(".")[-2])
    if heads is None:
        return []
    hf = unpermute_from_interleaved(want, heads)  # the rows as Hugging Face stores them
    out = [("without the permutation (the rows in Hugging Face's order: permute W_q and W_k)", hf),
           ("with the inverse permutation (unpermute_from_interleaved: GGUF's order to HF's)",
            unpermute_from_interleaved(hf, heads))]
    if heads == TINY_LLAMA["n_kv_heads"]:
        out.append(("permuted for num_attention_heads heads: W_k has num_key_value_heads of them",
                    permute_for_interleaved(hf, TINY_LLAMA["n_heads"])))
    return out


@pytest.mark.parametrize("tied", [True, False])
def test_ex10_6_hf_directory_loads_back_to_the_gguf_weights(ex, tmp_path, tied):
    src = tmp_path / "tiny.gguf"
    write_tiny_llama(src, tie_embeddings=tied, seed=2)
    export_hf(src, tmp_path / "hf")  # un-permutes W_q / W_k into Hugging Face's order
    with read_gguf(src) as g:
        want = dequantize_all(g)
    got = ex.load_hf_weights(tmp_path / "hf", permute_qk=True)
    assert set(got) == set(want), f"missing {sorted(set(want) - set(got))}, extra {sorted(set(got) - set(want))}"
    for name in want:
        assert_matches(got[name], want[name], permutation_variants(name, want[name]),
                       what=f"your load_hf_weights' {name}", axes=("row", "column")[: want[name].ndim], tol=0.0)
    raw = ex.load_hf_weights(tmp_path / "hf", permute_qk=False)
    assert not np.array_equal(raw["blk.0.attn_q.weight"], want["blk.0.attn_q.weight"]), (
        "without permute_qk the rows stay in Hugging Face's order"
    )
