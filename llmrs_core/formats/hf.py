"""Hugging Face model directories: loading them, and writing one from a GGUF file (chapter 10).

A Hugging Face Llama checkpoint is a directory with ``config.json``,
``model.safetensors`` (or shards listed in ``model.safetensors.index.json``),
``tokenizer.json`` and ``tokenizer_config.json``. Its tensor names and one
layout detail differ from GGUF's:

* names: ``model.layers.3.self_attn.q_proj.weight`` is ``blk.3.attn_q.weight``;
* the rows of W_q and W_k are in the order that Hugging Face's half-split
  ("rotate_half") RoPE expects. llama.cpp's converter permutes them for its
  interleaved RoPE (:func:`llmrs_core.rope.permute_for_interleaved`).

:class:`HFWeights` presents a directory under GGUF names. By default it
permutes W_q/W_k as the converter does, so the model runs with the usual
interleaved RoPE; with ``permute_qk=False`` it keeps Hugging Face's order and
the model runs half-split RoPE instead — the two give the same logits.
:func:`export_hf` goes the other way: GGUF -> float32 safetensors in HF
layout (un-permuted), with config and tokenizer files.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..config import ModelConfig, check_hf_model_type, check_layer_count
from ..rope import permute_for_interleaved, unpermute_from_interleaved
from .safetensors import SafetensorsFile, read_safetensors, write_safetensors
from .source import WeightSource

if TYPE_CHECKING:
    from ..tokenizer import Tokenizer

# (Hugging Face pattern, GGUF pattern); {i} is the layer number
NAME_MAP = [
    ("model.embed_tokens.weight", "token_embd.weight"),
    ("model.norm.weight", "output_norm.weight"),
    ("lm_head.weight", "output.weight"),
    ("model.layers.{i}.input_layernorm.weight", "blk.{i}.attn_norm.weight"),
    ("model.layers.{i}.self_attn.q_proj.weight", "blk.{i}.attn_q.weight"),
    ("model.layers.{i}.self_attn.k_proj.weight", "blk.{i}.attn_k.weight"),
    ("model.layers.{i}.self_attn.v_proj.weight", "blk.{i}.attn_v.weight"),
    ("model.layers.{i}.self_attn.o_proj.weight", "blk.{i}.attn_output.weight"),
    ("model.layers.{i}.post_attention_layernorm.weight", "blk.{i}.ffn_norm.weight"),
    ("model.layers.{i}.mlp.gate_proj.weight", "blk.{i}.ffn_gate.weight"),
    ("model.layers.{i}.mlp.up_proj.weight", "blk.{i}.ffn_up.weight"),
    ("model.layers.{i}.mlp.down_proj.weight", "blk.{i}.ffn_down.weight"),
]


# where a family's Hugging Face names differ from Llama's, or add to them (llama.cpp's
# gguf-py tensor_mapping.py). Gemma's "post_attention_layernorm" is a norm *after* attention;
# its MLP's input norm is "pre_feedforward_layernorm".
_BIASES = [(f"model.layers.{{i}}.self_attn.{x}_proj.bias", f"blk.{{i}}.attn_{x}.bias") for x in "qkv"]
_QK_NORMS = [("model.layers.{i}.self_attn.q_norm.weight", "blk.{i}.attn_q_norm.weight"),
             ("model.layers.{i}.self_attn.k_norm.weight", "blk.{i}.attn_k_norm.weight")]
_GEMMA = [("model.layers.{i}.post_attention_layernorm.weight", "blk.{i}.post_attention_norm.weight"),
          ("model.layers.{i}.pre_feedforward_layernorm.weight", "blk.{i}.ffn_norm.weight"),
          ("model.layers.{i}.post_feedforward_layernorm.weight", "blk.{i}.post_ffw_norm.weight")]
FAMILY_NAME_MAPS = {
    "llama": NAME_MAP + _BIASES,
    "qwen2": NAME_MAP + _BIASES,
    "qwen3": NAME_MAP + _QK_NORMS,
    "phi3": NAME_MAP + [("model.layers.{i}.self_attn.qkv_proj.weight", "blk.{i}.attn_qkv.weight"),
                        ("model.layers.{i}.mlp.gate_up_proj.weight", "blk.{i}.ffn_up.weight")],
    "gemma2": _GEMMA + NAME_MAP,
    "gemma3": _GEMMA + NAME_MAP + _QK_NORMS,
}


def family_hf_to_gguf_name(name: str, architecture: str) -> str | None:
    """:func:`hf_to_gguf_name` for a family's directory: its own names first (Gemma's norms)."""
    for hf, gguf in FAMILY_NAME_MAPS[architecture]:
        pattern = re.escape(hf).replace(r"\{i\}", r"(\d+)")
        m = re.fullmatch(pattern, name)
        if m:
            return gguf.replace("{i}", m.group(1)) if m.groups() else gguf
    return None


def _read_json(path: Path) -> object:
    """A JSON file of a model directory; ``ValueError`` naming it if it is not JSON (or is nested
    deeper than the parser's stack)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None
    except RecursionError:
        raise ValueError(f"{path}: JSON nested too deeply") from None


def _translate(name: str, src: int, dst: int) -> str | None:
    for pair in NAME_MAP:
        pattern = re.escape(pair[src]).replace(r"\{i\}", r"(\d+)")
        m = re.fullmatch(pattern, name)
        if m:
            return pair[dst].replace("{i}", m.group(1)) if m.groups() else pair[dst]
    return None


def hf_to_gguf_name(name: str) -> str | None:
    """``model.layers.3.mlp.up_proj.weight`` -> ``blk.3.ffn_up.weight``; None if unknown."""
    return _translate(name, 0, 1)


def gguf_to_hf_name(name: str) -> str | None:
    return _translate(name, 1, 0)


@dataclass(frozen=True)
class TensorShape:
    """What the engine needs to know of a tensor before reading it."""

    shape: tuple[int, ...]
    type_name: str
    n_bytes: int

    @property
    def n_elements(self) -> int:
        return int(np.prod(self.shape)) if self.shape else 1


class HFWeights(WeightSource):
    """A Hugging Face Llama directory seen as a weight source in GGUF names (float32).

    Attributes: ``path``, ``config`` (from config.json), ``tensors`` (GGUF name
    -> :class:`TensorShape`), ``rope_layout`` ("interleaved" or "half").
    """

    def __init__(self, directory: str | os.PathLike[str], permute_qk: bool = True):
        self.path = Path(directory)
        config_path = self.path / "config.json"
        if not config_path.exists():
            raise FileNotFoundError(f"{self.path} has no config.json: not a Hugging Face model directory")
        raw_config = _read_json(config_path)
        if not isinstance(raw_config, dict):
            raise ValueError(f"{config_path}: expected a JSON object, got {type(raw_config).__name__}")
        arch = check_hf_model_type(raw_config.get("model_type", "llama"), config_path)
        self._config = ModelConfig.from_hf_config(raw_config)
        self._raw_config = raw_config
        # Llama's rows are permuted for interleaved RoPE as llama.cpp's converter does; the
        # other families keep Hugging Face's order in GGUF too, and run half-split RoPE
        self.rope_layout = "interleaved" if permute_qk and arch == "llama" else "half"
        self._files: list[SafetensorsFile] = []
        self._where: dict[str, tuple[SafetensorsFile, str]] = {}
        index = self.path / "model.safetensors.index.json"
        if index.exists():
            weight_map = _read_json(index)
            weight_map = weight_map.get("weight_map") if isinstance(weight_map, dict) else None
            if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
                raise ValueError(f"{index}: expected an object whose \"weight_map\" maps tensor names to files")
            shards = sorted(set(weight_map.values()))
        elif (self.path / "model.safetensors").exists():
            shards = ["model.safetensors"]
        else:
            raise FileNotFoundError(f"{self.path} has no model.safetensors (nor an index of shards)")
        for shard in shards:
            f = read_safetensors(self.path / shard)
            self._files.append(f)
            for hf_name in f.tensors:
                name = family_hf_to_gguf_name(hf_name, arch)
                if name is None:
                    continue  # rotary caches and the like: not weights the engine needs
                self._where[name] = (f, hf_name)
        self.tensors = {
            name: TensorShape(f.tensors[hf].shape, f.tensors[hf].dtype, f.tensors[hf].end - f.tensors[hf].begin)
            for name, (f, hf) in self._where.items()
        }
        self._derived = derived_tensors(raw_config, self._config)
        self.tensors |= {name: TensorShape(w.shape, "F32", w.nbytes) for name, w in self._derived.items()}
        check_layer_count(self._config.n_layers, self.tensors, "num_hidden_layers", config_path)
        self.file_size = sum((self.path / shard).stat().st_size for shard in shards)
        self.metadata = {"general.name": self.path.name}

    @property
    def config(self) -> ModelConfig:
        """The architecture, from ``config.json``."""
        return self._config

    def tokenizer(self) -> Tokenizer | None:
        """The directory's ``tokenizer.json``, or ``None`` if it has none."""
        from ..tokenizer.hf import from_hf_dir

        if not (self.path / "tokenizer.json").exists():
            return None
        return from_hf_dir(self.path)

    def float32(self, name: str) -> np.ndarray:
        """Tensor ``name`` (GGUF naming) as float32, W_q/W_k rows permuted for interleaved RoPE if asked."""
        if name in self._derived:
            return self._derived[name]
        try:
            f, hf_name = self._where[name]
        except KeyError:
            raise KeyError(f"no tensor {name!r} in {self.path}") from None
        w = f.to_float32(hf_name)
        if name.endswith("norm.weight") and self._config.family.norm_offset:
            w = w + np.float32(self._config.family.norm_offset)  # Gemma's (1 + w), stored as GGUF does
        if self.rope_layout == "interleaved":
            if name.endswith("attn_q.weight"):
                w = permute_for_interleaved(w, self.config.n_heads)
            elif name.endswith("attn_k.weight"):
                w = permute_for_interleaved(w, self.config.n_kv_heads)
        return w

    def close(self) -> None:
        for f in self._files:
            f.close()


def llama3_frequency_factors(params: dict, dims: int, theta: float) -> np.ndarray:
    """``[dims / 2]`` divisors of the RoPE frequencies of a Llama 3.1+ ``rope_scaling``
    (``rope_type: llama3``), as llama.cpp's converter writes them into ``rope_freqs.weight``
    (the same rule as transformers' ``_compute_llama3_parameters``): wavelengths longer than
    ``original / low_freq_factor`` slow down by ``factor``, shorter than ``original /
    high_freq_factor`` keep their speed, and the band between is interpolated smoothly."""
    factor, low, high = params["factor"], params.get("low_freq_factor", 1.0), params.get("high_freq_factor", 4.0)
    original = params["original_max_position_embeddings"]
    freqs = theta ** -(np.arange(0, dims, 2, dtype=np.float64) / dims)
    wavelen = 2 * np.pi / freqs
    smooth = (original / wavelen - low) / (high - low)
    factors = np.where(wavelen < original / high, 1.0,
                       np.where(wavelen > original / low, factor, 1.0 / ((1 - smooth) / factor + smooth)))
    return factors.astype(np.float32)


def derived_tensors(raw: dict, config: ModelConfig) -> dict[str, np.ndarray]:
    """The tensors llama.cpp's converter computes from a ``config.json`` rather than reads:
    Llama 3's ``rope_freqs.weight`` and Phi-3's ``rope_factors_{long,short}.weight``."""
    from ..family_config import _rope_parameters

    params = _rope_parameters(raw)
    kind = params.get("rope_type", params.get("type"))
    if kind == "llama3":
        return {"rope_freqs.weight": llama3_frequency_factors(params, config.rope_dims, config.rope_theta)}
    if kind == "longrope":
        return {f"rope_factors_{x}.weight": np.asarray(params[f"{x}_factor"], dtype=np.float32) for x in ("long", "short")}
    return {}


def hf_config_dict(config: ModelConfig) -> dict:
    """``config.json`` content for a Llama model with this config."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.n_layers,
        "num_attention_heads": config.n_heads,
        "num_key_value_heads": config.n_kv_heads,
        "head_dim": config.head_dim,
        "max_position_embeddings": config.context_length,
        "rope_theta": config.rope_theta,
        "rms_norm_eps": config.rms_norm_eps,
        "tie_word_embeddings": config.tie_embeddings,
        "hidden_act": "silu",
        "torch_dtype": "float32",
    }


def export_hf(gguf_path: str | os.PathLike[str], out_dir: str | os.PathLike[str]) -> Path:
    """Write a GGUF Llama model as a Hugging Face directory: float32 safetensors, HF layout.

    W_q/W_k are un-permuted back to Hugging Face's row order. The tokenizer
    (``tokenizer.json``, ``tokenizer_config.json``) is written from the GGUF's
    vocabulary, merges, special tokens and chat template.
    """
    from ..quant.dequant import dequantize_tensor
    from ..tokenizer import Tokenizer
    from ..tokenizer.hf import save_hf
    from .gguf import read_gguf

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with read_gguf(gguf_path) as g:
        config = ModelConfig.from_gguf(g)
        tensors = {}
        for name in g.tensors:
            hf_name = gguf_to_hf_name(name)
            if hf_name is None:
                continue
            w = dequantize_tensor(g, name)
            if name.endswith("attn_q.weight"):
                w = unpermute_from_interleaved(w, config.n_heads)
            elif name.endswith("attn_k.weight"):
                w = unpermute_from_interleaved(w, config.n_kv_heads)
            tensors[hf_name] = np.ascontiguousarray(w, dtype=np.float32)
        write_safetensors(out / "model.safetensors", tensors, {"format": "pt"})
        (out / "config.json").write_text(json.dumps(hf_config_dict(config), indent=2) + "\n")
        if "tokenizer.ggml.model" in g.metadata:  # test models may have no tokenizer
            save_hf(Tokenizer.from_gguf(g), out)
    return out
