"""Make tiny random models of every model family, and their golden outputs.

Issue 28: the engine runs the GGUF files people download (Llama 3.x, Qwen2.5,
Qwen3, Mistral, Phi-3.5/4-mini, Gemma 2/3). There is no model hub here, so this
script builds one tiny model per family with transformers' own classes and
random weights, with every quirk of the family switched on, converts it with
llama.cpp's own converter, and records what transformers and llama.cpp compute
on it. The tests compare the engine with these files; CI needs neither torch
nor llama.cpp. Run it in a throwaway environment that has the references, never
in the project's own::

    /opt/ref-venv/bin/python scripts/make_family_models.py all \\
        --sdist llama_cpp_python-0.3.36.tar.gz

(`pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36` fetches the
sdist; it vendors llama.cpp's convert_hf_to_gguf.py and gguf-py.)

Steps (each writes into tests/golden/families/):

    tokenizer  one SentencePiece model (BPE, byte fallback, 320 pieces) trained on
               this repository's README -> tokenizer.model, shared by every family
               (llama.cpp's converter reads tokenizer.model for every family here)
    hf         per family: <name>/hf/ (config.json, model.safetensors, tokenizer files)
               saved by transformers; <name>/golden.npz with ids, hf_logits [T, V],
               hf_prompt, hf_greedy; rope_*.npz (transformers' rotary embeddings)
    gguf       per family: <name>/model.gguf by convert_hf_to_gguf.py --outtype f32
               (the sdist's vendored gguf-py first on PYTHONPATH)
    llamacpp   per family: llamacpp_logits and llamacpp_greedy added to golden.npz
               (llama-cpp-python, F32 KV cache, no flash attention); golden.json
               with the agreement figures
    all        the four in order; tokenizer only if tokenizer.model is missing (the README it
               learns from changes, and a new tokenizer rewrites every GGUF's vocabulary for
               nothing: the tests feed ids)
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "tests" / "golden" / "families"
SPM_FILE = OUT / "tokenizer.model"

VOCAB = 320  # the SentencePiece model's size; every family's config uses it
T = 32  # tokens in the logits sequence: four sliding windows of 8
N_PROMPT = 6  # the greedy prompt is the first N_PROMPT of the ids
N_GREEDY = 32
SLIDING_WINDOW = 8
OUT_SCALE = 3.0  # multiplies W_o and W_down (see _randomise)
N_CTX = 256  # llama.cpp's context: <= Phi-3's original context, so both pick the short factors

# Every family shares these shapes unless it says otherwise: hidden 64, 4 query heads
# of 16, 2 KV heads (GQA), SwiGLU/GeGLU width 32, vocab 320, float32: each GGUF
# stays under 600 kB, all files together under 6 MB.
COMMON: dict[str, Any] = {
    "vocab_size": VOCAB,
    "hidden_size": 64,
    "intermediate_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-5,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": None,
    "dtype": "float32",
}


@dataclass
class Family:
    """One family's tiny model: its transformers classes and the config's quirks."""

    name: str
    model_class: str  # transformers class, e.g. "LlamaForCausalLM"
    config_class: str
    config: dict[str, Any]
    quirks: str  # what the model exercises, for golden.json and the README
    arch: str  # general.architecture the converter writes
    q_scale: float = 1.0  # multiplies W_q: larger attention scores, so the soft-cap matters
    # the embedding's standard deviation; Gemma's is small, since it multiplies its embedding by
    # sqrt(hidden) = 8, and its final norm makes up for it (see _randomise)
    embed_std: float = 1.0
    seed: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


def _families() -> list[Family]:
    return [
        Family(
            "llama3", "LlamaForCausalLM", "LlamaConfig",
            {
                "max_position_embeddings": 131072,
                "rope_theta": 500000.0,
                "rope_scaling": {
                    "rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0, "original_max_position_embeddings": 8192,
                },
                "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": False,
            },
            "Llama 3.x: llama3 RoPE frequency factors (rope_freqs.weight), untied output head",
            "llama", seed=1,
        ),
        Family(
            "llama2-linear", "LlamaForCausalLM", "LlamaConfig",
            {
                "max_position_embeddings": 4096, "rope_theta": 10000.0,
                "rope_scaling": {"rope_type": "linear", "factor": 2.0},
                "attention_bias": False, "tie_word_embeddings": False,
            },
            "Llama 2 style with linear RoPE scaling (factor 2: positions divided by 2)",
            "llama", seed=2,
        ),
        Family(
            "mistral", "MistralForCausalLM", "MistralConfig",
            {
                "max_position_embeddings": 4096, "rope_theta": 1000000.0, "head_dim": 32,
                "sliding_window": None, "tie_word_embeddings": False,
            },
            "Mistral (llama in GGUF): head_dim 32 != hidden/heads 16 (attention.key_length), "
            "no sliding window",
            "llama", seed=3,
        ),
        Family(
            "qwen2", "Qwen2ForCausalLM", "Qwen2Config",
            {
                "max_position_embeddings": 4096, "rope_theta": 1000000.0, "tie_word_embeddings": True,
                "use_sliding_window": False,
            },
            "Qwen2.5: q/k/v biases (non-zero), half-split RoPE, tied embeddings",
            "qwen2", seed=4,
        ),
        Family(
            "qwen3", "Qwen3ForCausalLM", "Qwen3Config",
            {
                "max_position_embeddings": 4096, "rope_theta": 1000000.0, "head_dim": 32,
                "tie_word_embeddings": True, "attention_bias": False, "use_sliding_window": False,
            },
            "Qwen3: per-head q/k RMSNorm (jittered), head_dim 32 != hidden/heads 16, tied embeddings",
            "qwen3", seed=5,
        ),
        Family(
            "phi3", "Phi3ForCausalLM", "Phi3Config",
            {
                "max_position_embeddings": 1024, "original_max_position_embeddings": N_CTX,
                "partial_rotary_factor": 0.75,
                "rope_scaling": {
                    "rope_type": "longrope",
                    # rotary dims = 16 * 0.75 = 12 -> 6 factors each
                    "short_factor": [1.0, 1.05, 1.1, 1.3, 1.7, 2.2],
                    "long_factor": [1.0, 1.5, 2.5, 4.0, 6.0, 9.0],
                },
                "tie_word_embeddings": True, "sliding_window": None,
            },
            "Phi-4-mini style: fused qkv and gate_up, longrope (short/long factors, attn_factor), "
            "partial rotary 0.75 (rope dimension_count 12 < head_dim 16), tied embeddings",
            "phi3", seed=6,
        ),
        Family(
            "gemma2", "Gemma2ForCausalLM", "Gemma2Config",
            {
                "max_position_embeddings": 4096, "rope_theta": 10000.0, "head_dim": 32,
                "query_pre_attn_scalar": 32,  # = head_dim, as Gemma 2 2B/9B (llama.cpp assumes it)
                "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0,
                "sliding_window": SLIDING_WINDOW, "hidden_activation": "gelu_pytorch_tanh",
                "tie_word_embeddings": True,
            },
            "Gemma 2: GeGLU, 4 norms per block (stored w, GGUF w + 1), embedding x sqrt(hidden), "
            "attention soft-cap 50, final soft-cap 30, sliding window 8 on every other layer, "
            "head_dim 32 != hidden/heads 16",
            "gemma2", q_scale=4.0, embed_std=0.25, seed=10,
        ),
        Family(
            "gemma3", "Gemma3ForCausalLM", "Gemma3TextConfig",
            {
                "max_position_embeddings": 4096, "head_dim": 16, "num_attention_heads": 2,
                "num_key_value_heads": 1, "query_pre_attn_scalar": 16,
                "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
                "sliding_window": SLIDING_WINDOW, "sliding_window_pattern": 6,
                "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": True,
                "num_hidden_layers": 6,
            },
            "Gemma 3 (text), 1B-like: 2 heads of 16 != hidden/heads 32 with 1 KV head, q/k norms, "
            "GeGLU, 4 norms, embedding x sqrt(hidden), layers 0-4 sliding "
            "(window 8, RoPE base 1e4 = rope.freq_base_swa) and layer 5 global (base 1e6); the "
            "converter writes no pattern, llama.cpp defaults to 6 as the config does",
            "gemma3", embed_std=0.25, seed=12,
        ),
    ]


FAMILIES = {f.name: f for f in _families()}


def _ids() -> np.ndarray:
    """The logits sequence: BOS then 31 ids drawn once, the same for every family."""
    rng = np.random.default_rng(28)
    return np.concatenate([[1], rng.integers(3, VOCAB, T - 1)]).astype(np.int32)


# ---------------------------------------------------------------- tokenizer


def make_tokenizer() -> None:
    import sentencepiece as spm

    text = (REPO / "README.md").read_text(encoding="utf-8")
    with tempfile.TemporaryDirectory() as tmp:
        prefix = Path(tmp) / "spm"
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(text.splitlines()), model_prefix=str(prefix), vocab_size=VOCAB,
            model_type="bpe", byte_fallback=True, character_coverage=0.98, num_threads=1,
            unk_id=0, bos_id=1, eos_id=2, pad_id=-1, minloglevel=2,
            normalization_rule_name="identity",  # NFKC's table would add 240 kB to every copy
        )
        OUT.mkdir(parents=True, exist_ok=True)
        shutil.copy(f"{prefix}.model", SPM_FILE)
    sp = spm.SentencePieceProcessor(model_file=str(SPM_FILE))
    print(f"wrote {SPM_FILE}: {sp.vocab_size()} pieces; 'Hello world' -> {sp.encode('Hello world')}")


def _save_tokenizer(hf_dir: Path) -> None:
    """tokenizer.model for the converter, tokenizer.json + tokenizer_config.json from transformers."""
    from transformers import LlamaTokenizer

    shutil.copy(SPM_FILE, hf_dir / "tokenizer.model")
    tok = LlamaTokenizer.from_pretrained(str(hf_dir))
    tok.save_pretrained(str(hf_dir))


# ---------------------------------------------------------------- transformers


def _build(fam: Family):
    import torch
    import transformers

    config_cls = getattr(transformers, fam.config_class)
    model_cls = getattr(transformers, fam.model_class)
    kwargs = copy.deepcopy({**COMMON, **fam.config})  # transformers edits rope_scaling in place
    config = config_cls(**kwargs)
    config._attn_implementation = "eager"
    torch.manual_seed(fam.seed)
    model = model_cls(config).eval()
    _randomise(model, fam)
    return model


def _randomise(model, fam: Family) -> None:
    """Weights that make every quirk matter: unit-scale activations, jittered norms, non-zero biases.

    transformers' own init (std 0.02, norms at one) leaves logits nearly uniform, where a wrong
    RoPE or a missing norm hides below float32 noise.
    """
    import torch

    g = torch.Generator().manual_seed(1000 + fam.seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if p.ndim == 1 and "norm" in name:
                # standard RMSNorm weights start at one, Gemma's (stored as w, applied as 1 + w) at zero
                p.add_(0.2 * torch.randn(p.shape, generator=g))
                if name == "model.norm.weight":
                    # a tied head's logits scale with the embedding: keep them O(10)
                    p.add_(1.0 / fam.embed_std - 1.0)
                if "post_" in name:
                    # Gemma's norms after each block: their scale is the block's weight against
                    # the embedding (x sqrt(hidden)) in the residual stream
                    p.add_(OUT_SCALE)
            elif p.ndim == 1:  # biases
                p.copy_(0.2 * torch.randn(p.shape, generator=g))
            elif "embed" in name:
                p.copy_(fam.embed_std * torch.randn(p.shape, generator=g))
            else:
                scale = 1.0 / p.shape[1] ** 0.5
                if name.endswith(("q_proj.weight", "qkv_proj.weight")):
                    scale *= fam.q_scale
                if name.endswith(("o_proj.weight", "down_proj.weight")):
                    # the blocks' outputs outweigh the embedding in the residual stream, else a tied
                    # model's greedy output repeats its last token
                    scale *= OUT_SCALE
                p.copy_(scale * torch.randn(p.shape, generator=g))


def _hf_logits(model, ids: np.ndarray) -> np.ndarray:
    import torch

    with torch.no_grad():
        out = model(torch.tensor(ids[None].astype(np.int64)), use_cache=False)
    return out.logits[0].float().numpy()


def _hf_greedy(model, prompt: np.ndarray) -> np.ndarray:
    """transformers' generate (KV cache, greedy), never stopping early at EOS."""
    import torch
    from transformers import GenerationConfig

    cfg = GenerationConfig(
        do_sample=False, max_new_tokens=N_GREEDY, min_new_tokens=0, eos_token_id=None,
        pad_token_id=0, bos_token_id=1,
    )
    model.generation_config.eos_token_id = None  # else generate stops at EOS (id 2); llama.cpp does not
    with torch.no_grad():
        out = model.generate(torch.tensor(prompt[None].astype(np.int64)), generation_config=cfg)
    greedy = out[0, len(prompt):].numpy().astype(np.int32)
    # the same tokens without the cache: argmax of full forwards (catches a cache-path quirk)
    seq = list(prompt)
    for _ in range(N_GREEDY):
        seq.append(int(_hf_logits(model, np.array(seq))[-1].argmax()))
    nocache = np.array(seq[len(prompt):], dtype=np.int32)
    if not np.array_equal(greedy, nocache):
        print(f"  note: generate {greedy.tolist()} != no-cache argmax {nocache.tolist()}")
    return greedy


def _quirk_costs(fam: Family, base: np.ndarray, ids: np.ndarray) -> dict[str, float]:
    """max |logits - logits with one quirk switched off| / max |logits|: what a test would see."""

    variants: dict[str, dict[str, Any]] = {}
    rs = fam.config.get("rope_scaling")
    if rs is not None and rs["rope_type"] in ("llama3", "linear"):
        variants["no rope scaling"] = {"rope_scaling": None}
    if fam.name == "phi3":
        variants["full rotary (partial_rotary_factor 1)"] = {
            "partial_rotary_factor": 1.0,
            "rope_scaling": {**rs, "short_factor": [1.0] * 8, "long_factor": [1.0] * 8},
        }
        variants["no longrope (factors 1)"] = {
            "rope_scaling": {**rs, "short_factor": [1.0] * 6, "long_factor": [1.0] * 6},
        }
    if "attn_logit_softcapping" in fam.config:
        variants["no attention soft-cap"] = {"attn_logit_softcapping": None}
    if fam.config.get("final_logit_softcapping"):
        variants["no final soft-cap"] = {"final_logit_softcapping": None}
    if fam.config.get("sliding_window"):
        variants["no sliding window"] = {"sliding_window": 4096}
    if fam.name == "gemma3":
        variants["one RoPE base (1e6) for all layers"] = {"rope_local_base_freq": 1000000.0}
    costs = {}
    for label, change in variants.items():
        other = _build(Family(**{**fam.__dict__, "config": {**fam.config, **change}}))
        # same weights: the changed config does not change any tensor's shape
        other.load_state_dict(_build(fam).state_dict())
        costs[label] = _cost(other, base, ids)
    for label, edit in _module_edits(fam).items():
        other = _build(fam)
        edit(other)
        costs[label] = _cost(other, base, ids)
    return costs


def _cost(model, base: np.ndarray, ids: np.ndarray) -> float:
    return float(np.abs(_hf_logits(model, ids) - base).max() / np.abs(base).max())


def _module_edits(fam: Family) -> dict[str, Any]:
    """Quirks that live in weights or modules rather than in the config: switched off in place."""
    import torch

    def layers(model):
        return model.model.layers

    def zero_biases(model):
        with torch.no_grad():
            for layer in layers(model):
                for proj in ("q_proj", "k_proj", "v_proj"):
                    getattr(layer.self_attn, proj).bias.zero_()

    def no_qk_norm(model):
        for layer in layers(model):
            layer.self_attn.q_norm = torch.nn.Identity()
            layer.self_attn.k_norm = torch.nn.Identity()

    def no_post_norms(model):
        for layer in layers(model):
            layer.post_attention_layernorm = torch.nn.Identity()
            layer.post_feedforward_layernorm = torch.nn.Identity()

    def no_embed_scale(model):
        model.model.embed_tokens.embed_scale.fill_(1.0)

    edits = {}
    if fam.name == "qwen2":
        edits["no q/k/v biases"] = zero_biases
    if fam.name in ("qwen3", "gemma3"):
        edits["no q/k norm"] = no_qk_norm
    if fam.name.startswith("gemma"):
        edits["no post-attention/post-FFN norms"] = no_post_norms
        edits["no embedding scale sqrt(hidden)"] = no_embed_scale
    return edits


def make_hf(names: list[str]) -> None:
    import torch
    import transformers

    ids = _ids()
    for name in names:
        fam = FAMILIES[name]
        model = _build(fam)
        hf_dir = OUT / name / "hf"
        if hf_dir.exists():
            shutil.rmtree(hf_dir)
        model.save_pretrained(str(hf_dir))
        _save_tokenizer(hf_dir)
        # a model loaded back from the directory must give the same logits (the saved files are the model)
        loaded = getattr(transformers, fam.model_class).from_pretrained(
            str(hf_dir), dtype=torch.float32, attn_implementation="eager"
        ).eval()
        logits = _hf_logits(model, ids)
        again = _hf_logits(loaded, ids)
        assert np.array_equal(logits, again), f"{name}: reloaded model differs"
        greedy = _hf_greedy(loaded, ids[:N_PROMPT])
        data = {"ids": ids, "hf_logits": logits.astype(np.float32), "hf_prompt": ids[:N_PROMPT],
                "hf_greedy": greedy}
        np.savez_compressed(OUT / name / "golden.npz", **data)
        costs = _quirk_costs(fam, logits, ids)
        _update_json(name, {
            "model_class": fam.model_class, "quirks": fam.quirks, "gguf_architecture": fam.arch,
            "config": {**COMMON, **fam.config}, "q_scale": fam.q_scale, "seed": fam.seed,
            "quirk_off_cost": costs,
        })
        n = sum(p.numel() for p in model.parameters())
        print(f"{name}: {n:,} parameters; greedy {greedy[:8].tolist()}... "
              f"({len(set(greedy.tolist()))} distinct); quirk costs "
              + ", ".join(f"{k} {v:.2g}" for k, v in costs.items()))
    make_rope()


def make_rope() -> None:
    """transformers' rotary embeddings at positions where the scaling rules matter."""
    import torch
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RotaryEmbedding
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
    from transformers.models.phi3.modeling_phi3 import Phi3RotaryEmbedding

    def cos_sin(rope, positions, **kw):
        pos = torch.tensor([positions], dtype=torch.int64)
        x = torch.zeros(1, len(positions), 8, dtype=torch.float32)
        with torch.no_grad():
            cos, sin = rope(x, pos, **kw)
        return cos[0].numpy().astype(np.float32), sin[0].numpy().astype(np.float32)

    llama = _build(FAMILIES["llama3"])
    pos = [0, 1, 100, 2048, 8191, 8192, 9000, 30000, 100000]
    cos, sin = cos_sin(LlamaRotaryEmbedding(llama.config), pos)
    plain = _build(Family(**{**FAMILIES["llama3"].__dict__,
                             "config": {**FAMILIES["llama3"].config, "rope_scaling": None}}))
    cos0, sin0 = cos_sin(LlamaRotaryEmbedding(plain.config), pos)
    np.savez_compressed(OUT / "rope_llama3.npz", positions=np.array(pos, np.int64), cos=cos, sin=sin,
                        unscaled_cos=cos0, unscaled_sin=sin0)
    print(f"rope_llama3: max |cos - unscaled| at each position "
          f"{np.abs(cos - cos0).max(axis=1).round(4).tolist()}")

    phi = _build(FAMILIES["phi3"])
    short = [0, 1, 100, 200, N_CTX - 1]  # max position + 1 <= original: short factors
    long = [0, 1, 100, N_CTX, 1000, 1023]  # one call past the original: long factors for all of it
    cs, ss = cos_sin(Phi3RotaryEmbedding(phi.config), short)
    cl, sl = cos_sin(Phi3RotaryEmbedding(phi.config), long)
    np.savez_compressed(OUT / "rope_phi3.npz", short_positions=np.array(short, np.int64), short_cos=cs,
                        short_sin=ss, long_positions=np.array(long, np.int64), long_cos=cl, long_sin=sl)
    print(f"rope_phi3: rotary dims {cs.shape[1]}, cos[0] {cs[0, :3].tolist()} (attn_factor)")

    gemma = _build(FAMILIES["gemma3"])
    rope = Gemma3RotaryEmbedding(gemma.config)
    pos = [0, 1, 7, 100, 1000, 4000]
    out = {"positions": np.array(pos, np.int64)}
    for layer_type in ("sliding_attention", "full_attention"):
        c, s = cos_sin(rope, pos, layer_type=layer_type)
        out[f"{layer_type}_cos"], out[f"{layer_type}_sin"] = c, s
    np.savez_compressed(OUT / "rope_gemma3.npz", **out)
    print("rope_gemma3: sliding (base 1e4) and full (base 1e6) layers")


# ---------------------------------------------------------------- llama.cpp


def _llama_cpp_dir(sdist: Path) -> Path:
    """The vendored llama.cpp of a llama-cpp-python sdist (a .tar.gz or an unpacked directory)."""
    if sdist.is_dir():
        root = sdist
    else:
        cache = Path(tempfile.gettempdir()) / "llmrs-sdist" / sdist.name.removesuffix(".tar.gz")
        if not cache.exists():
            cache.parent.mkdir(parents=True, exist_ok=True)
            with tarfile.open(sdist) as tar:
                tar.extractall(cache.parent, filter="data")
        root = cache
    found = sorted(root.glob("**/vendor/llama.cpp/convert_hf_to_gguf.py"))
    if not found:
        sys.exit(f"{sdist}: no vendor/llama.cpp/convert_hf_to_gguf.py in it")
    return found[0].parent


def make_gguf(names: list[str], sdist: Path) -> None:
    llama_cpp = _llama_cpp_dir(sdist)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(llama_cpp / "gguf-py"), str(llama_cpp)]))
    for name in names:
        out = OUT / name / "model.gguf"
        cmd = [sys.executable, str(llama_cpp / "convert_hf_to_gguf.py"), str(OUT / name / "hf"),
               "--outfile", str(out), "--outtype", "f32"]
        res = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if res.returncode != 0:
            print(f"{name}: convert_hf_to_gguf.py failed:\n{res.stderr[-3000:]}")
            _update_json(name, {"convert_error": res.stderr[-2000:]})
            continue
        print(f"{name}: wrote {out} ({out.stat().st_size:,} bytes)")
        _update_json(name, {"convert_error": None, "gguf_bytes": out.stat().st_size})


def _llamacpp_run(path: Path, ids: np.ndarray, prompt: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    from llama_cpp import Llama

    llm = Llama(model_path=str(path), n_ctx=N_CTX, n_batch=N_CTX, n_ubatch=N_CTX, n_threads=2,
                logits_all=True, type_k=0, type_v=0, flash_attn=False, seed=0, verbose=False)
    llm.eval([int(i) for i in ids])
    logits = np.array(llm.scores[: len(ids)], dtype=np.float32)
    llm.reset()
    llm.eval([int(i) for i in prompt])
    greedy = []
    for _ in range(N_GREEDY):
        tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        greedy.append(tok)
        llm.eval([tok])
    return logits, np.array(greedy, dtype=np.int32)


def make_llamacpp(names: list[str]) -> None:
    import llama_cpp

    for name in names:
        path = OUT / name / "model.gguf"
        if not path.exists():
            print(f"{name}: no model.gguf, skipped")
            continue
        npz = OUT / name / "golden.npz"
        data = dict(np.load(npz))
        logits, greedy = _llamacpp_run(path, data["ids"], data["hf_prompt"])
        hf = data["hf_logits"]
        rel = float(np.abs(hf - logits).max() / np.abs(hf).max())
        same = bool(np.array_equal(greedy, data["hf_greedy"]))
        top1 = float((hf.argmax(-1) == logits.argmax(-1)).mean())
        bound, why = _llamacpp_bound(json.loads((OUT / name / "hf" / "config.json").read_text()))
        data.update(llamacpp_logits=logits, llamacpp_greedy=greedy)
        np.savez_compressed(npz, **data)
        _update_json(name, {
            "hf_vs_llamacpp_max_rel": rel, "llamacpp_bound": bound, "bound_why": why, "hf_vs_llamacpp_top1_agreement": top1,
            "greedy_equal": same,
            "greedy_first_difference": None if same else int(np.argmax(greedy != data["hf_greedy"])),
            "llamacpp": f"llama-cpp-python {llama_cpp.__version__}, n_ctx {N_CTX}, F32 KV, "
                        "flash_attn off, n_threads 2",
        })
        print(f"{name}: max|hf - llama.cpp| / max|hf| = {rel:.2e}, top-1 {top1:.3f}, greedy equal {same}")


def _llamacpp_bound(cfg: dict[str, Any]) -> tuple[float, str]:
    """How far transformers and llama.cpp may differ on a family, from the arithmetic."""
    if cfg.get("hidden_activation", "").startswith("gelu"):
        # ggml's CPU GELU looks its input up in an fp16 table: each activation carries a relative
        # error up to one fp16 rounding (2^-11) instead of float32's 2^-24
        return 4 * 2.0**-11, "ggml's CPU GELU reads an fp16 table: 4 fp16 roundings (4 * 2^-11)"
    heads = cfg["num_attention_heads"]
    k = max(cfg["hidden_size"], cfg["intermediate_size"], heads * (cfg.get("head_dim") or cfg["hidden_size"] // heads))
    depth = cfg["num_hidden_layers"]
    bound = 10 * (k * depth) ** 0.5 * 2.0**-24
    return bound, (f"float32 sums of K = {k} terms in other orders over {depth} layers: "
                   "10 * sqrt(K * layers) * 2^-24 (as llmrs_core.testing.float32_tolerance)")


# ---------------------------------------------------------------- bookkeeping


def _update_json(name: str, entries: dict[str, Any]) -> None:
    path = OUT / "golden.json"
    data = json.loads(path.read_text()) if path.exists() else {}
    data.setdefault("families", {}).setdefault(name, {}).update(entries)
    data["versions"] = _versions()
    data["sequence"] = {"T": T, "prompt_tokens": N_PROMPT, "greedy_tokens": N_GREEDY,
                        "sliding_window": SLIDING_WINDOW, "llamacpp_n_ctx": N_CTX}
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")


def _versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {}
    for pkg in ("transformers", "torch", "sentencepiece", "llama-cpp-python"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            out[pkg] = "not installed"
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("steps", nargs="+", choices=["tokenizer", "hf", "gguf", "llamacpp", "rope", "all"])
    parser.add_argument("--family", action="append", choices=sorted(FAMILIES),
                        help="only these families (repeatable; default: all)")
    parser.add_argument("--sdist", type=Path, help="llama-cpp-python sdist (.tar.gz or unpacked), for gguf")
    args = parser.parse_args()
    names = args.family or list(FAMILIES)
    steps = args.steps
    if "all" in steps:
        steps = (["tokenizer"] if not SPM_FILE.exists() else []) + ["hf", "gguf", "llamacpp"]
    OUT.mkdir(parents=True, exist_ok=True)
    for step in steps:
        if step == "tokenizer":
            make_tokenizer()
        elif step == "hf":
            make_hf(names)
        elif step == "rope":
            make_rope()
        elif step == "gguf":
            if args.sdist is None:
                parser.error("the gguf step needs --sdist")
            make_gguf(names, args.sdist)
        elif step == "llamacpp":
            make_llamacpp(names)


if __name__ == "__main__":
    main()
