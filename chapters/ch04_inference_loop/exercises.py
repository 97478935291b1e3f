"""Chapter 4 — Building the Core Inference Loop: your exercises.

Exercise 4.6  Building a Complete Inference Loop  (ch04_inference_loop.ipynb, section 4.6)
Exercise 4.7  Sampling Strategies                 (ch04_inference_loop.ipynb, section 4.7)

Check your work with ``make test-chapter 4`` (or ``make test-exercise E=4.6``).
Once they pass, ``llmrs generate --backend learner "..."`` runs SmolLM2 with
your layers and your sampler.

Shapes: T = tokens, d = hidden_size (576), V = vocab_size (49152).
A weight matrix is [out_features, in_features]; a linear layer is x @ W.T.
``weights`` maps llama.cpp tensor names ("blk.0.attn_q.weight", ...) to
float32 arrays: ``llmrs_core.quant.dequantize_all(model.source)`` makes it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from llmrs_core.config import ModelConfig
from llmrs_core.sampling import SamplingParams

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


# -- Exercise 4.6: the layers and the loop --------------------------------------


def linear(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """``x [T, in]`` times ``w [out, in]`` transposed: ``[T, out]``. No bias."""
    raise NotImplementedError(
        "Exercise 4.6 `linear`: not implemented yet — see ch04_inference_loop.ipynb §4.6"
    )


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """``x / sqrt(mean(x ** 2) + eps) * weight`` over the last axis, float32 out. ``x [T, d]``, ``weight [d]``."""
    raise NotImplementedError(
        "Exercise 4.6 `rms_norm`: not implemented yet — see ch04_inference_loop.ipynb §4.6"
    )


def silu(x: np.ndarray) -> np.ndarray:
    """``x * sigmoid(x)``. It must not overflow or warn for ``x = -1000``."""
    raise NotImplementedError(
        "Exercise 4.6 `silu`: not implemented yet — see ch04_inference_loop.ipynb §4.6"
    )


def swiglu(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """The MLP's gated activation: ``silu(gate) * up`` (both ``[T, intermediate_size]``)."""
    raise NotImplementedError(
        "Exercise 4.6 `swiglu`: not implemented yet — see ch04_inference_loop.ipynb §4.6"
    )


def decoder_block(
    x: np.ndarray,
    weights: Mapping[str, np.ndarray],
    layer: int,
    config: ModelConfig,
    positions: np.ndarray,
) -> np.ndarray:
    """One Llama block on the residual stream ``x [T, d]`` (no KV cache: all T tokens at once).

    With ``w = lambda n: weights[f"blk.{layer}.{n}.weight"]``::

        h = rms_norm(x, w("attn_norm"), eps)
        q = linear(h, w("attn_q")) as [T, n_heads, head_dim]; k, v from attn_k, attn_v as [T, n_kv_heads, head_dim]
        q, k = RoPE (interleaved, config.rope_theta) at ``positions``
        x = x + linear(causal attention(q, k, v) as [T, d], w("attn_output"))
        h = rms_norm(x, w("ffn_norm"), eps)
        x = x + linear(swiglu(linear(h, w("ffn_gate")), linear(h, w("ffn_up"))), w("ffn_down"))

    For RoPE and attention use your chapter 3 functions or the engine's
    (``llmrs_core.rope.apply_rope_interleaved``,
    ``llmrs_core.attention.scaled_dot_product_attention``). Returns ``[T, d]``.
    """
    raise NotImplementedError(
        "Exercise 4.6 `decoder_block`: not implemented yet — see ch04_inference_loop.ipynb §4.6"
    )


def forward(ids: Sequence[int], weights: Mapping[str, np.ndarray], config: ModelConfig) -> np.ndarray:
    """Token ids ``[T]`` (positions 0..T-1) -> logits ``[T, V]``.

    Embedding rows of ``token_embd.weight``, every :func:`decoder_block`,
    the final ``rms_norm`` with ``output_norm.weight``, then the output head:
    ``output.weight``, or ``token_embd.weight`` when ``config.tie_embeddings``.
    """
    raise NotImplementedError(
        "Exercise 4.6 `forward`: not implemented yet — see ch04_inference_loop.ipynb §4.6"
    )


def greedy_generate(
    logits_fn: Callable[[list[int]], np.ndarray],
    prompt_ids: Sequence[int],
    max_tokens: int,
    eos_token_id: int | None = None,
) -> list[int]:
    """The simplest generation loop: ``max_tokens`` times, run ``logits_fn`` on the whole
    sequence so far, take the argmax of the last row and append it.

    Stop early (without appending it) when the argmax is ``eos_token_id``.
    Return only the generated ids. Each step recomputes every earlier token —
    chapter 5's KV cache removes that waste.
    """
    raise NotImplementedError(
        "Exercise 4.6 `greedy_generate`: not implemented yet — see ch04_inference_loop.ipynb §4.6"
    )


# -- Exercise 4.7: sampling ---------------------------------------------------------


def apply_penalties(
    logits: np.ndarray,
    history: Sequence[int],
    repetition_penalty: float = 1.0,
    presence_penalty: float = 0.0,
    frequency_penalty: float = 0.0,
) -> np.ndarray:
    """Discourage tokens already in ``history``; return a new float32 array.

    For each distinct token in ``history`` seen ``c`` times: with a
    repetition penalty ``r``, divide its logit by ``r`` if positive, multiply by
    ``r`` if negative; then subtract ``presence_penalty + frequency_penalty * c``.
    """
    raise NotImplementedError(
        "Exercise 4.7 `apply_penalties`: not implemented yet — see ch04_inference_loop.ipynb §4.7"
    )


def apply_temperature(logits: np.ndarray, temperature: float) -> np.ndarray:
    """``logits / temperature``; a temperature <= 0 raises ``ValueError`` (0 means greedy elsewhere)."""
    raise NotImplementedError(
        "Exercise 4.7 `apply_temperature`: not implemented yet — see ch04_inference_loop.ipynb §4.7"
    )


def top_k_filter(logits: np.ndarray, k: int) -> np.ndarray:
    """Keep the ``k`` largest logits (ties with the k-th are kept too), the rest become ``-inf``.
    ``k <= 0`` or ``k >= len(logits)`` keeps everything."""
    raise NotImplementedError(
        "Exercise 4.7 `top_k_filter`: not implemented yet — see ch04_inference_loop.ipynb §4.7"
    )


def top_p_filter(logits: np.ndarray, p: float) -> np.ndarray:
    """Nucleus filtering: sort by probability, keep tokens while the probability *before* each
    one is below ``p`` — so the token that crosses ``p`` is kept, and the most likely
    token always is. The rest become ``-inf``. ``p >= 1`` keeps everything."""
    raise NotImplementedError(
        "Exercise 4.7 `top_p_filter`: not implemented yet — see ch04_inference_loop.ipynb §4.7"
    )


def min_p_filter(logits: np.ndarray, min_p: float) -> np.ndarray:
    """Drop (``-inf``) tokens whose probability is below ``min_p`` times the largest probability."""
    raise NotImplementedError(
        "Exercise 4.7 `min_p_filter`: not implemented yet — see ch04_inference_loop.ipynb §4.7"
    )


def sample_token(
    logits: np.ndarray,
    params: SamplingParams,
    rng: np.random.Generator,
    history: Sequence[int] = (),
) -> int:
    """The whole chain: penalties; if ``params.temperature == 0`` the argmax; otherwise
    temperature, top-k, top-p, min-p, then draw one id from the softmax with ``rng.choice``."""
    raise NotImplementedError(
        "Exercise 4.7 `sample_token`: not implemented yet — see ch04_inference_loop.ipynb §4.7"
    )
