"""The family fixtures are self-consistent (tests/golden/families/, issue 28).

scripts/make_family_models.py writes them with transformers and llama.cpp, which CI does not
have; these checks catch a broken or partial regeneration without either: every file is
there, every shape agrees with the family's config.json, the GGUF says what the config says,
and the two references agree with each other within the bound golden.json states. They test
the fixtures, not the engine (tests/core/test_families.py does that).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from llmrs_core.formats.gguf import read_gguf
from llmrs_core.quant.types import GGMLType
from llmrs_core.testing import normalised_error

ROOT = Path(__file__).resolve().parents[1] / "golden" / "families"
FIGURES = json.loads((ROOT / "golden.json").read_text())
FAMILIES = sorted(FIGURES["families"])
HF_FILES = ["config.json", "model.safetensors", "tokenizer.model", "tokenizer.json", "tokenizer_config.json"]
SEQ = FIGURES["sequence"]


def config(name: str) -> dict:
    return json.loads((ROOT / name / "hf" / "config.json").read_text())


def golden(name: str) -> dict[str, np.ndarray]:
    with np.load(ROOT / name / "golden.npz") as g:
        return dict(g)


def gguf_fields(name: str) -> tuple[dict, dict[str, tuple[tuple[int, ...], GGMLType]]]:
    """The GGUF's metadata and its tensors' (shape in NumPy order, type)."""
    with read_gguf(ROOT / name / "model.gguf") as g:
        return dict(g.metadata), {n: (t.shape, t.ggml_type) for n, t in g.tensors.items()}


def test_the_list_of_families_is_the_one_issue_28_names():
    assert {"llama3", "qwen2", "qwen3", "phi3", "gemma2", "gemma3"} <= set(FAMILIES)
    assert {p.name for p in ROOT.iterdir() if p.is_dir()} == set(FAMILIES), "a folder golden.json omits"


@pytest.mark.parametrize("name", FAMILIES)
def test_every_file_is_there(name):
    missing = [f"hf/{f}" for f in HF_FILES if not (ROOT / name / "hf" / f).is_file()]
    missing += [f for f in ("model.gguf", "golden.npz") if not (ROOT / name / f).is_file()]
    assert not missing, f"{name}: missing {missing}"
    assert FIGURES["families"][name].get("convert_error") is None, FIGURES["families"][name]["convert_error"]
    # one tokenizer for every family (the converter reads tokenizer.model)
    assert (ROOT / name / "hf" / "tokenizer.model").read_bytes() == (ROOT / "tokenizer.model").read_bytes()
    # tiny: the whole folder is committed
    assert (ROOT / name / "model.gguf").stat().st_size < 1 << 20


@pytest.mark.parametrize("name", FAMILIES)
def test_golden_shapes_match_the_config(name):
    cfg, g = config(name), golden(name)
    vocab, t, n_prompt = cfg["vocab_size"], SEQ["T"], SEQ["prompt_tokens"]
    assert g["ids"].shape == (t,) and g["ids"].min() >= 0 and g["ids"].max() < vocab
    assert np.array_equal(g["hf_prompt"], g["ids"][:n_prompt])
    for ref in ("hf", "llamacpp"):
        logits, greedy = g[f"{ref}_logits"], g[f"{ref}_greedy"]
        assert logits.shape == (t, vocab) and logits.dtype == np.float32 and np.isfinite(logits).all()
        assert greedy.shape == (SEQ["greedy_tokens"],) and greedy.min() >= 0 and greedy.max() < vocab
        # the first greedy token is the argmax after the prompt, which the logits sequence also holds
        # (unless the top two are too close to call across two float32 computations)
        last = np.sort(logits[n_prompt - 1])
        if last[-1] - last[-2] > 1e-4 * np.abs(logits).max():
            assert greedy[0] == logits[n_prompt - 1].argmax(), f"{name}: {ref}_greedy[0] is not the argmax"


@pytest.mark.parametrize("name", FAMILIES)
def test_safetensors_shapes_match_the_config(name):
    cfg = config(name)
    w = load_file(ROOT / name / "hf" / "model.safetensors")
    hidden, heads, kv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    head_dim = cfg.get("head_dim") or hidden // heads
    assert w["model.embed_tokens.weight"].shape == (cfg["vocab_size"], hidden)
    assert ("lm_head.weight" in w) == (not cfg["tie_word_embeddings"])
    layers = {int(k.split(".")[2]) for k in w if k.startswith("model.layers.")}
    assert layers == set(range(cfg["num_hidden_layers"]))
    attn = "model.layers.0.self_attn."
    if attn + "qkv_proj.weight" in w:  # Phi-3's fused [q; k; v]
        assert w[attn + "qkv_proj.weight"].shape == ((heads + 2 * kv) * head_dim, hidden)
    else:
        assert w[attn + "q_proj.weight"].shape == (heads * head_dim, hidden)
        assert w[attn + "k_proj.weight"].shape == (kv * head_dim, hidden)
    assert all(v.dtype == np.float32 for v in w.values())


@pytest.mark.parametrize("name", FAMILIES)
def test_the_gguf_says_what_the_config_says(name):
    cfg, info = config(name), FIGURES["families"][name]
    fields, shapes = gguf_fields(name)
    arch = info["gguf_architecture"]
    heads = cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    assert fields["general.architecture"] == arch
    want = {
        "block_count": cfg["num_hidden_layers"], "embedding_length": cfg["hidden_size"],
        "feed_forward_length": cfg["intermediate_size"], "attention.head_count": heads,
        "attention.head_count_kv": cfg["num_key_value_heads"],
    }
    got = {k: fields.get(f"{arch}.{k}") for k in want}
    assert got == want
    assert fields.get(f"{arch}.attention.key_length", head_dim) == head_dim
    assert shapes["token_embd.weight"] == ((cfg["vocab_size"], cfg["hidden_size"]), GGMLType.F32)
    assert {t for _, t in shapes.values()} == {GGMLType.F32}, "--outtype f32 writes every tensor as F32"
    # the quirk the family is here for is in the file
    quirk_tensors = {"llama3": "rope_freqs.weight", "qwen2": "blk.0.attn_q.bias", "qwen3": "blk.0.attn_q_norm.weight",
                     "phi3": "rope_factors_long.weight", "gemma2": "blk.0.post_ffw_norm.weight",
                     "gemma3": "blk.0.attn_k_norm.weight"}
    if name in quirk_tensors:
        assert quirk_tensors[name] in shapes


@pytest.mark.parametrize("name", FAMILIES)
def test_transformers_and_llama_cpp_agree_within_the_stated_bound(name):
    """The two references on the same model: a regeneration that broke one of them shows here."""
    g, info = golden(name), FIGURES["families"][name]
    err = normalised_error(g["llamacpp_logits"], g["hf_logits"])
    assert err == pytest.approx(info["hf_vs_llamacpp_max_rel"], rel=1e-6), "golden.json's figure is stale"
    assert err <= info["llamacpp_bound"], f"{name}: {err:.2e} > {info['llamacpp_bound']:.1e} ({info['bound_why']})"
    assert np.array_equal(g["hf_greedy"], g["llamacpp_greedy"]) == info["greedy_equal"]
    assert info["greedy_equal"], f"{name}: the references' greedy tokens differ"


def test_rope_fixtures_are_rotations():
    """cos^2 + sin^2 is the attention factor squared: 1, or Phi-3's longrope attn_factor, which the
    converter wrote into the GGUF (so both references scale by the same number)."""
    fields, _ = gguf_fields("phi3")
    attn_factor = fields["phi3.rope.scaling.attn_factor"]
    cases = {"llama3": (["", "unscaled_"], 1.0), "phi3": (["short_", "long_"], attn_factor),
             "gemma3": (["full_attention_", "sliding_attention_"], 1.0)}
    for name, (prefixes, scale) in cases.items():
        r = dict(np.load(ROOT / f"rope_{name}.npz"))
        for pre in prefixes:
            cos, sin = r[pre + "cos"], r[pre + "sin"]
            positions = r.get(pre + "positions", r.get("positions"))
            assert cos.shape == sin.shape and cos.shape[0] == len(positions)
            np.testing.assert_allclose(cos**2 + sin**2, scale**2, rtol=1e-5, err_msg=f"rope_{name} {pre}")
    llama = dict(np.load(ROOT / "rope_llama3.npz"))
    # Llama 3's factors leave the highest frequency alone and change the low ones past 8,192
    assert np.allclose(llama["cos"][:, 0], llama["unscaled_cos"][:, 0], atol=1e-6)
    assert np.abs(llama["cos"] - llama["unscaled_cos"])[llama["positions"] >= 8192].max() > 0.1
    gemma = dict(np.load(ROOT / "rope_gemma3.npz"))
    assert np.abs(gemma["full_attention_cos"] - gemma["sliding_attention_cos"]).max() > 0.1
