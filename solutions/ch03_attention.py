"""Chapter 3 solutions: the engine's attention and RoPE (llmrs_core.attention, llmrs_core.rope)."""

from llmrs_core.attention import causal_mask, scaled_dot_product_attention, softmax
from llmrs_core.rope import apply_rope_half, apply_rope_interleaved, permute_for_interleaved, rope_frequencies

__all__ = [
    "apply_rope_half",
    "apply_rope_interleaved",
    "causal_mask",
    "permute_for_interleaved",
    "rope_frequencies",
    "scaled_dot_product_attention",
    "softmax",
]
