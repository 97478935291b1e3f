"""Chapter 4 solutions.

The layers and the sampler are engine code (llmrs_core.layers,
llmrs_core.sampling). ``decoder_block``, ``forward`` and ``greedy_generate``
are the plain, cache-free versions that teach the loop; the engine's own
(llmrs_core.model, llmrs_core.generate) adds the KV cache and the backend.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from llmrs_core.attention import scaled_dot_product_attention
from llmrs_core.config import ModelConfig
from llmrs_core.layers import linear, rms_norm, silu, swiglu
from llmrs_core.rope import apply_rope_interleaved
from llmrs_core.sampling import (
    SamplingParams,
    apply_penalties,
    apply_temperature,
    min_p_filter,
    sample_token,
    top_k_filter,
    top_p_filter,
)

__all__ = [
    "SamplingParams",
    "apply_penalties",
    "apply_temperature",
    "decoder_block",
    "forward",
    "greedy_generate",
    "linear",
    "min_p_filter",
    "rms_norm",
    "sample_token",
    "silu",
    "swiglu",
    "top_k_filter",
    "top_p_filter",
]


def decoder_block(
    x: np.ndarray,
    weights: Mapping[str, np.ndarray],
    layer: int,
    config: ModelConfig,
    positions: np.ndarray,
) -> np.ndarray:
    c = config
    t = x.shape[0]

    def w(name: str) -> np.ndarray:
        return weights[f"blk.{layer}.{name}.weight"]

    h = rms_norm(x, w("attn_norm"), c.rms_norm_eps)
    q = linear(h, w("attn_q")).reshape(t, c.n_heads, c.head_dim)
    k = linear(h, w("attn_k")).reshape(t, c.n_kv_heads, c.head_dim)
    v = linear(h, w("attn_v")).reshape(t, c.n_kv_heads, c.head_dim)
    q = apply_rope_interleaved(q, positions, c.rope_theta)
    k = apply_rope_interleaved(k, positions, c.rope_theta)
    attn = scaled_dot_product_attention(q, k, v, causal=True).reshape(t, c.n_heads * c.head_dim)
    x = x + linear(attn, w("attn_output"))
    h = rms_norm(x, w("ffn_norm"), c.rms_norm_eps)
    return x + linear(swiglu(linear(h, w("ffn_gate")), linear(h, w("ffn_up"))), w("ffn_down"))


def forward(ids: Sequence[int], weights: Mapping[str, np.ndarray], config: ModelConfig) -> np.ndarray:
    ids = np.asarray(ids, dtype=np.int64)
    x = weights["token_embd.weight"][ids].astype(np.float32)
    positions = np.arange(ids.size)
    for layer in range(config.n_layers):
        x = decoder_block(x, weights, layer, config, positions)
    x = rms_norm(x, weights["output_norm.weight"], config.rms_norm_eps)
    head = weights["token_embd.weight"] if config.tie_embeddings else weights["output.weight"]
    return linear(x, head)


def greedy_generate(
    logits_fn: Callable[[list[int]], np.ndarray],
    prompt_ids: Sequence[int],
    max_tokens: int,
    eos_token_id: int | None = None,
) -> list[int]:
    sequence = list(prompt_ids)
    generated: list[int] = []
    for _ in range(max_tokens):
        token = int(np.argmax(logits_fn(sequence)[-1]))
        if token == eos_token_id:
            break
        generated.append(token)
        sequence.append(token)
    return generated
