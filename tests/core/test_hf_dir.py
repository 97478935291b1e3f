"""GGUF -> Hugging Face directory (float32 safetensors, HF layout) -> back into the engine."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

import llmrs_core as llmrs
from llmrs_core.backends import NumpyBackend
from llmrs_core.config import ConfigError
from llmrs_core.formats.hf import HFWeights, export_hf, gguf_to_hf_name, hf_to_gguf_name
from llmrs_core.model import LlamaModel
from llmrs_core.testing import float32_tolerance, normalised_error, write_tiny_llama


def test_name_mapping_round_trips():
    for name in ["token_embd.weight", "output.weight", "output_norm.weight", "blk.17.attn_q.weight",
                 "blk.0.ffn_down.weight", "blk.3.attn_norm.weight", "blk.3.ffn_norm.weight"]:
        assert hf_to_gguf_name(gguf_to_hf_name(name)) == name
    assert gguf_to_hf_name("blk.2.attn_k.weight") == "model.layers.2.self_attn.k_proj.weight"
    assert hf_to_gguf_name("model.layers.0.self_attn.rotary_emb.inv_freq") is None


@pytest.mark.parametrize("tied", [True, False])
def test_tiny_model_round_trip(tmp_path, tied):
    src = tmp_path / "tiny.gguf"
    write_tiny_llama(src, tie_embeddings=tied, seed=1)
    export_hf(src, tmp_path / "hf")
    with llmrs.read_gguf(src) as g:
        cfg = llmrs.ModelConfig.from_gguf(g)
    ids = [1, 5, 9, 13, 2]
    want = llmrs.load(src).logits(ids)
    # the same float32 weights; other kernels (and, unpermuted, the other RoPE) sum in other orders
    tolerance = float32_tolerance(cfg)
    for permute in (True, False):
        w = HFWeights(tmp_path / "hf", permute_qk=permute)
        assert w.config == cfg
        got = LlamaModel(w, w.config, NumpyBackend()).forward(ids)
        np.testing.assert_allclose(got, want, rtol=0, atol=tolerance * np.abs(want).max(),
                                   err_msg=f"permute_qk={permute} ({w.rope_layout} RoPE)")


def test_bad_directories(tmp_path):
    with pytest.raises(FileNotFoundError, match="no config.json"):
        HFWeights(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        HFWeights(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 8, "num_attention_heads": 2,
                                                      "vocab_size": 4, "intermediate_size": 8,
                                                      "num_hidden_layers": 1}))
    with pytest.raises(FileNotFoundError, match="no model.safetensors"):
        HFWeights(tmp_path)


@pytest.mark.model
def test_smollm2_exported_to_hf_layout_gives_the_same_logits(model_path, tmp_path, hf_golden):
    out = export_hf(model_path, tmp_path / "smollm2-hf")
    # exact: the GGUF's products on the float kernels, as the HF directory's float32 weights get
    gguf_model, hf_model = llmrs.load(model_path, exact=True), llmrs.load(out)
    ids = hf_golden["ids_2"].tolist()
    assert hf_model.tokenizer.encode(str(hf_golden["prompts"][2])) == ids
    want = gguf_model.logits(ids)
    # The GGUF model multiplies by its Q4_1 blocks, the exported one by the same weights in float32
    # (other kernels): the same numbers summed in other orders, through 30 layers, to logits of up to
    # ~40. Measured: 3e-6 of max |logit| (1.1e-4 absolute); float32_tolerance gives 1.3e-4 (5e-3
    # absolute), while weights rounded to float16 on export would be about 1e-3 and a wrong Q/K
    # permutation or norm of order 1.
    tolerance = float32_tolerance(gguf_model.network.config)
    np.testing.assert_allclose(hf_model.logits(ids), want, rtol=0, atol=tolerance * np.abs(want).max())
    half = HFWeights(out, permute_qk=False)  # Hugging Face's own row order, half-split RoPE
    got = LlamaModel(half, half.config, NumpyBackend()).forward(ids)
    assert normalised_error(got, want) <= tolerance
    tokenizers = pytest.importorskip("tokenizers")
    reference = tokenizers.Tokenizer.from_file(str(out / "tokenizer.json"))
    text = "<|im_start|>user\nHi 2024 🦀<|im_end|>"
    assert reference.encode(text).ids == gguf_model.tokenizer.encode(text)
    st = pytest.importorskip("safetensors.numpy")
    weights = st.load_file(str(out / "model.safetensors"))
    assert weights["model.layers.0.self_attn.q_proj.weight"].shape == (576, 576)
    assert "lm_head.weight" not in weights, "tied embeddings: no separate output head"


def exported(tmp_path, **config_changes):
    """A tiny model exported as a Hugging Face directory, its config.json edited."""
    tmp_path.mkdir(exist_ok=True)
    write_tiny_llama(tmp_path / "tiny.gguf")
    out = export_hf(tmp_path / "tiny.gguf", tmp_path / "hf")
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, **config_changes}).replace("Infinity", "1e400"))
    return out


def test_a_damaged_layer_count_is_refused_before_anything_per_layer(tmp_path):
    """num_hidden_layers: 1000000 made load() list 9 tensor names per layer (2 GB, 30 s) before it
    found the first one missing; now it is compared with the layers the weights hold, at once."""
    out = exported(tmp_path, num_hidden_layers=1_000_000)
    started = time.perf_counter()
    with pytest.raises(ConfigError, match=r"num_hidden_layers is 1,000,000, but the weights hold tensors of 2 "
                                          r"layers \(blk\.0 \.\. blk\.1\)"):
        llmrs.load(out, backend="numpy")
    assert time.perf_counter() - started < 1.0


@pytest.mark.parametrize("key, value, match", [
    ("num_hidden_layers", float("inf"), r"'num_hidden_layers' must be a finite number, got inf"),  # 1e400
    ("hidden_size", float("inf"), r"'hidden_size' must be a finite number"),
    ("rope_theta", float("inf"), r"'rope_theta' must be a finite number"),
    ("num_attention_heads", 0, r"'num_attention_heads' must be a positive integer, got 0"),  # was ZeroDivisionError
    ("intermediate_size", "64", r"'intermediate_size' must be an integer, got str '64'"),
    ("num_hidden_layers", 2.5, r"'num_hidden_layers' must be an integer, got 2.5"),
    ("rms_norm_eps", [1e-5], r"'rms_norm_eps' must be a number, got list"),
])
def test_an_impossible_config_json_value_is_a_config_error_naming_it(tmp_path, key, value, match):
    out = exported(tmp_path, **{key: value})
    with pytest.raises(ConfigError, match=match):
        HFWeights(out)


def test_json_nested_too_deeply_is_a_value_error(tmp_path):
    out = exported(tmp_path)
    (out / "config.json").write_text("[" * 200_000)
    with pytest.raises(ValueError, match=r"config\.json: JSON nested too deeply"):
        HFWeights(out)
    out = exported(tmp_path / "again")
    (out / "tokenizer.json").write_text("[" * 200_000)
    with pytest.raises(ValueError, match=r"tokenizer\.json: JSON nested too deeply"):
        llmrs.load(out, backend="numpy").tokenizer  # noqa: B018
