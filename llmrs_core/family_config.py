"""The family fields of a :class:`~llmrs_core.config.ModelConfig`, read from a GGUF file's
metadata (llama.cpp's keys and defaults) or a Hugging Face ``config.json`` (transformers').

Each reader returns only the fields that differ from Llama's defaults, so a SmolLM2 config is
the same dataclass it always was. Values that a family fixes without a key follow llama.cpp
(``src/models/<family>.cpp``): Gemma 2's window 4096 and soft-caps 50 and 30, Gemma 3's
local RoPE base 10,000, the 27B models' attention scale ``1 / sqrt(hidden / heads)``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from .families import Family


def swa_layers(n_layers: int, pattern: Any, default: int, source: object) -> tuple[int, ...]:
    """Indices of the sliding-window layers. ``pattern`` is llama.cpp's
    ``sliding_window_pattern``: an int ``n`` (layer ``i`` slides unless ``i % n == n - 1``),
    a list of booleans (one per layer), or ``None`` for the family's ``default``."""
    from .config import ConfigError

    if pattern is None:
        pattern = default
    if isinstance(pattern, (list, tuple)):
        if len(pattern) != n_layers or not all(isinstance(p, (bool, int)) for p in pattern):
            raise ConfigError(f"{source}: sliding_window_pattern must hold one boolean per layer "
                              f"({n_layers}), got {pattern!r:.80}")
        return tuple(i for i, p in enumerate(pattern) if p)
    if not isinstance(pattern, int) or isinstance(pattern, bool) or pattern < 0:
        raise ConfigError(f"{source}: sliding_window_pattern must be a non-negative integer, got {pattern!r}")
    return tuple(i for i in range(n_layers) if pattern == 0 or i % pattern < pattern - 1)


def _big_gemma_scale(arch: str, n_layers: int, hidden: int, n_heads: int) -> float:
    """llama.cpp's Gemma 27B rule: those models scale q.k by 1/sqrt(hidden / heads), not by
    1/sqrt(head_dim); every other size by the latter (0.0: the default)."""
    if (arch, n_layers) in {("gemma2", 46), ("gemma3", 62)}:
        return 1.0 / math.sqrt(hidden // n_heads)
    return 0.0


def gguf_family_fields(md: Mapping[str, Any], tensors: Mapping[str, Any], fam: Family, *, n_layers: int,
                       hidden: int, n_heads: int, head_dim: int, rope_theta: float, context: int,
                       source: object) -> dict[str, Any]:
    """ModelConfig fields from the ``{arch}.*`` keys of a GGUF's metadata ``md``."""
    from .config import ConfigError, _f32, _number

    arch = fam.name

    def num(key: str, default: Any, integer: bool = False) -> Any:
        full = f"{arch}.{key}"
        return default if full not in md else _number(md[full], full, source, integer)

    out: dict[str, Any] = {}
    if fam.qkv_bias or "blk.0.attn_q.bias" in tensors:
        out["qkv_bias"] = True
    rot = num("rope.dimension_count", head_dim, integer=True)
    if rot != head_dim:
        out["rotary_dim"] = rot
    kind = md.get(f"{arch}.rope.scaling.type", "linear")
    factor = num("rope.scaling.factor", 0.0) or num("rope.scale_linear", 0.0)
    if kind == "linear" and factor not in (0.0, 1.0):
        out["rope_scale"] = _f32(factor)
    elif kind not in ("linear", "none", "longrope"):
        raise ConfigError(f"{source}: RoPE scaling {kind!r} is not supported (supported: none, linear, "
                          "llama3's rope_freqs, longrope)")
    if "rope_factors_long.weight" in tensors:
        out["rope_original_context"] = num("rope.scaling.original_context_length", context, integer=True)
        out["rope_attn_factor"] = _f32(num("rope.scaling.attn_factor", 1.0))
    if fam.swa_pattern:
        window = num("attention.sliding_window", 4096 if arch == "gemma2" else 0, integer=True)
        if window:
            out["sliding_window"] = window
            out["swa_layers"] = swa_layers(n_layers, md.get(f"{arch}.attention.sliding_window_pattern"),
                                           fam.swa_pattern, source)
            out["rope_theta_swa"] = _f32(num("rope.freq_base_swa", rope_theta if arch == "gemma2" else 10000.0))
    if arch == "gemma2":
        out["attn_softcap"] = _f32(num("attn_logit_softcapping", 50.0))
        out["final_softcap"] = _f32(num("final_logit_softcapping", 30.0))
    elif arch == "gemma3" and num("final_logit_softcapping", 0.0):
        out["final_softcap"] = _f32(num("final_logit_softcapping", 0.0))
    scale = _big_gemma_scale(arch, n_layers, hidden, n_heads)
    if scale:
        out["attn_scale"] = _f32(scale)
    return out


def _rope_parameters(config: Mapping[str, Any], layer_type: str | None = None) -> Mapping[str, Any]:
    """transformers < 5 writes ``rope_scaling``; 5 writes ``rope_parameters``, per layer type
    for Gemma 3 (``{"full_attention": {...}, "sliding_attention": {...}}``)."""
    params = config.get("rope_parameters") or config.get("rope_scaling") or {}
    if layer_type is not None and isinstance(params.get(layer_type), Mapping):
        return params[layer_type]
    if isinstance(params.get("full_attention"), Mapping):
        return params["full_attention"]
    return params


def hf_family_fields(config: Mapping[str, Any], fam: Family, *, n_layers: int, hidden: int, n_heads: int,
                     head_dim: int, rope_theta: float, context: int) -> dict[str, Any]:
    """ModelConfig fields from a Hugging Face ``config.json``, equal to what llama.cpp's
    converter writes into the GGUF of the same model (``gguf_family_fields`` reads them)."""
    from .config import ConfigError, _f32

    arch = fam.name
    out: dict[str, Any] = {}
    if fam.qkv_bias or config.get("attention_bias"):
        out["qkv_bias"] = True
    params = _rope_parameters(config)
    partial = params.get("partial_rotary_factor", config.get("partial_rotary_factor", 1.0))
    rot = int(partial * hidden) // n_heads if partial != 1.0 else head_dim
    if rot != head_dim:
        out["rotary_dim"] = rot
    kind = params.get("rope_type", params.get("type", "default"))
    if kind == "linear":
        out["rope_scale"] = _f32(params["factor"])
    elif kind == "longrope":
        original = params.get("original_max_position_embeddings", config.get("original_max_position_embeddings"))
        out["rope_original_context"] = int(original)
        scale = context / original
        out["rope_attn_factor"] = _f32(math.sqrt(1 + math.log(scale) / math.log(original)) if scale > 1 else 1.0)
    elif kind not in ("default", "llama3"):
        raise ConfigError(f"config.json: RoPE scaling {kind!r} is not supported (supported: default, linear, "
                          "llama3, longrope)")
    if fam.swa_pattern and config.get("sliding_window"):
        out["sliding_window"] = int(config["sliding_window"])
        types = config.get("layer_types")
        if types is not None:
            out["swa_layers"] = tuple(i for i, t in enumerate(types) if t == "sliding_attention")
        else:
            out["swa_layers"] = swa_layers(n_layers, config.get("sliding_window_pattern"), fam.swa_pattern,
                                           "config.json")
        local = _rope_parameters(config, "sliding_attention").get("rope_theta", config.get("rope_local_base_freq"))
        out["rope_theta_swa"] = _f32(local if local is not None else rope_theta)
    for key, field in (("attn_logit_softcapping", "attn_softcap"), ("final_logit_softcapping", "final_softcap")):
        if config.get(key):
            out[field] = _f32(config[key])
    if arch in ("gemma2", "gemma3"):
        scalar = config.get("query_pre_attn_scalar", head_dim)
        if scalar != head_dim:
            out["attn_scale"] = _f32(scalar ** -0.5)
    return out




def family_features(config: Any, tensor_names: Any = ()) -> list[str]:
    """What a model does beyond SmolLM2's Llama path, in words (``llmrs info``; the backends and
    the distributed runs that support only that path name these when they refuse a model).
    ``tensor_names``: the source's tensors, for what only they tell (Llama 3's ``rope_freqs``,
    Phi-3's fused matrices)."""
    c, f = config, config.family
    names = set(tensor_names)
    out = []
    if f.rope_pairing == "half":
        out.append("half-split RoPE pairs")
    if c.qkv_bias:
        out.append("q/k/v biases")
    if f.qk_norm:
        out.append("per-head q/k RMSNorm")
    if c.n_heads * c.head_dim != c.hidden_size:
        out.append(f"head_dim {c.head_dim} (heads x head_dim {c.n_heads * c.head_dim} != hidden {c.hidden_size})")
    if "blk.0.attn_qkv.weight" in names or (f.fused_gate_up and "blk.0.ffn_gate.weight" not in names and names):
        out.append("fused QKV and gate/up matrices")
    if f.activation != "silu":
        out.append("GeGLU (gelu-tanh) MLP")
    if f.sandwich_norms:
        out.append("post-attention and post-MLP norms")
    if f.embed_scale:
        out.append("embedding x sqrt(hidden)")
    if "rope_freqs.weight" in names:
        out.append("RoPE frequency factors (Llama 3)")
    if c.rope_original_context:
        out.append(f"longrope (original context {c.rope_original_context}, attention factor {c.rope_attn_factor:.4g})")
    if c.rope_scale != 1.0:
        out.append(f"linear RoPE scaling x{c.rope_scale:g}")
    if c.rotary_dim:
        out.append(f"partial RoPE ({c.rotary_dim} of {c.head_dim} dimensions)")
    if c.sliding_window:
        out.append(f"sliding window {c.sliding_window} on {len(c.swa_layers)} of {c.n_layers} layers"
                   + (f" (their RoPE base {c.rope_theta_swa:g})" if c.rope_theta_swa != c.rope_theta else ""))
    if c.attn_softcap:
        out.append(f"attention soft-cap {c.attn_softcap:g}")
    if c.final_softcap:
        out.append(f"final soft-cap {c.final_softcap:g}")
    if c.attn_scale:
        out.append(f"attention scale {c.attn_scale:.4g}")
    return out


__all__ = ["family_features", "gguf_family_fields", "hf_family_fields", "swa_layers"]
