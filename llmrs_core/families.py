"""Model families: what each architecture the engine runs changes in the Llama forward pass.

One forward pass (:mod:`llmrs_core.model`) serves every family; a :class:`Family` declares
which of its switches a family turns on, and :class:`~llmrs_core.config.ModelConfig` carries
the numbers (soft-cap values, window size, RoPE scaling) that a file sets. SmolLM2 and the
other ``llama`` files have every switch off: the path chapter 4 teaches.

Why a table of flags and not a class per family: the families differ from Llama in a dozen
small places, each a line of the forward pass, seen beside it (appendix B.1 compares).

=============  ======================================================================
switch         meaning
=============  ======================================================================
rope_pairing   which dimensions RoPE pairs in the GGUF's W_q/W_k rows: "interleaved"
               (2i, 2i+1: llama.cpp's converter permutes Llama's rows) or "half"
               (i, i + n_rot/2: every other family, whose rows are stored as trained)
qkv_bias       W_q, W_k, W_v have biases (Qwen2; a ``llama`` file may have them too)
qk_norm        a per-head RMSNorm of q and k before RoPE (Qwen3, Gemma 3)
sandwich_norms norms after attention and after the MLP, before each residual add (Gemma)
embed_scale    the embedding is multiplied by sqrt(hidden_size) (Gemma)
activation     the MLP's gate: "silu" (SwiGLU) or "gelu_tanh" (GeGLU, Gemma)
fused_qkv      one ``attn_qkv`` matrix holds [W_q; W_k; W_v] (Phi-3)
fused_gate_up  ``ffn_up`` holds [W_gate; W_up] (Phi-3)
norm_offset    Hugging Face stores RMSNorm weights as w - 1 and multiplies by (1 + w);
               the GGUF converter stores w + 1 already (Gemma: 1.0)
swa_pattern    every how many layers one is global when a sliding window is set (the
               others slide): Gemma 2 every 2nd (1 of 2 global), Gemma 3 every 6th
=============  ======================================================================
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Family:
    """The switches of one architecture; see the module docstring for each."""

    name: str
    rope_pairing: str = "interleaved"
    qkv_bias: bool = False
    qk_norm: bool = False
    sandwich_norms: bool = False
    embed_scale: bool = False
    activation: str = "silu"
    fused_qkv: bool = False
    fused_gate_up: bool = False
    norm_offset: float = 0.0
    swa_pattern: int = 0


#: ``general.architecture`` (GGUF) -> its family
FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family("llama"),
        Family("qwen2", rope_pairing="half", qkv_bias=True),
        Family("qwen3", rope_pairing="half", qk_norm=True),
        Family("phi3", rope_pairing="half", fused_qkv=True, fused_gate_up=True),
        Family("gemma2", rope_pairing="half", sandwich_norms=True, embed_scale=True, activation="gelu_tanh",
               norm_offset=1.0, swa_pattern=2),
        Family("gemma3", rope_pairing="half", qk_norm=True, sandwich_norms=True, embed_scale=True,
               activation="gelu_tanh", norm_offset=1.0, swa_pattern=6),
    )
}

#: Hugging Face ``model_type`` -> GGUF architecture (Mistral's files are ``llama`` in GGUF)
HF_MODEL_TYPES: dict[str, str] = {
    "llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "phi3": "phi3",
    "gemma2": "gemma2", "gemma3_text": "gemma3", "gemma3": "gemma3",
}


def family(architecture: str) -> Family:
    """The family of a GGUF architecture name; ``KeyError`` if the engine does not run it
    (``config.check_architecture`` turns that into a ``ConfigError`` naming the file)."""
    return FAMILIES[architecture]


__all__ = ["FAMILIES", "HF_MODEL_TYPES", "Family", "family"]
