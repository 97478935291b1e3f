"""Chapter 1 — The Transformer Architecture: your exercises.

Exercise 1.6  Building a Model Config  (ch01_transformer.ipynb, section 1.6)

Fill in every method that raises ``NotImplementedError``, then check your
work with::

    make test-chapter 1          # all of chapter 1
    make test-exercise E=1.6     # just this exercise

Shapes of a Llama-family model, in the names of the fields below
(d = hidden_size, hd = head_dim)::

    token embedding      [vocab_size, d]
    W_q                  [n_heads * hd, d]
    W_k, W_v             [n_kv_heads * hd, d]
    W_o                  [d, n_heads * hd]
    W_gate, W_up         [intermediate_size, d]
    W_down               [d, intermediate_size]
    RMSNorm weights      [d]   (two per layer, one final)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from llmrs_core.config import ConfigError  # raise this for an impossible config
from llmrs_core.families import Family, family

if TYPE_CHECKING:
    from llmrs_core.formats.gguf import GGUFFile

__all__ = ["ConfigError", "ModelConfig"]


@dataclass(frozen=True)
class ModelConfig:
    """Architecture hyper-parameters of a decoder-only Llama-family transformer.

    Attributes:
        vocab_size: number of token ids (rows of the embedding table).
        hidden_size: model width d, the size of every residual-stream vector.
        intermediate_size: width of the SwiGLU MLP's hidden layer.
        n_layers: number of decoder blocks.
        n_heads: query heads per attention layer.
        n_kv_heads: key/value heads (grouped-query attention: each serves
            ``n_heads // n_kv_heads`` query heads).
        head_dim: size of one head's query/key/value vectors.
        context_length: longest sequence the model was trained for.
        rope_theta: base of the rotary position embedding frequencies.
        rms_norm_eps: epsilon added inside RMSNorm's square root.
        tie_embeddings: the output head reuses the token embedding matrix.
        architecture: model family, as GGUF's ``general.architecture`` names it.

    The fields after ``architecture`` are other model families' (appendix B: Qwen's biases,
    Gemma's sliding window, ...). They are given, with Llama's values as defaults: leave them;
    your ``from_gguf`` and ``from_hf_config`` need not set them for SmolLM2.
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    context_length: int
    rope_theta: float
    rms_norm_eps: float
    tie_embeddings: bool
    architecture: str = "llama"
    qkv_bias: bool = False
    rotary_dim: int = 0
    rope_scale: float = 1.0
    rope_original_context: int = 0
    rope_attn_factor: float = 1.0
    rope_theta_swa: float = 0.0
    sliding_window: int = 0
    swa_layers: tuple[int, ...] = ()
    attn_softcap: float = 0.0
    final_softcap: float = 0.0
    attn_scale: float = 0.0

    @property
    def family(self) -> Family:
        """(provided) The switches of this config's architecture (appendix B)."""
        return family(self.architecture)

    @property
    def rope_dims(self) -> int:
        """(provided) How many dimensions of each head RoPE rotates (appendix B)."""
        return self.rotary_dim or self.head_dim

    @classmethod
    def from_gguf(cls, gguf: GGUFFile) -> ModelConfig:
        """Build the config from a parsed GGUF file.

        ``gguf.metadata`` is a dict of the file's metadata; ``gguf.tensors`` maps
        tensor names to their infos. Read ``general.architecture`` (call it
        ``arch``, "llama" here) and then the ``{arch}.*`` keys:
        ``block_count``, ``embedding_length``, ``feed_forward_length``,
        ``attention.head_count``, ``attention.head_count_kv``, ``context_length``,
        ``rope.freq_base``, ``attention.layer_norm_rms_epsilon`` and
        ``vocab_size`` (if absent: the length of ``tokenizer.ggml.tokens``).
        ``head_dim`` is ``embedding_length // head_count``. Embeddings are tied
        when there is no ``output.weight`` tensor.

        Round ``rope_theta`` and ``rms_norm_eps`` to float32
        (``float(np.float32(x))``): GGUF stores them that way. Call
        :meth:`validate` before returning. A missing key raises ``ConfigError``
        naming the key.
        """
        raise NotImplementedError(
            "Exercise 1.6 `ModelConfig.from_gguf`: not implemented yet — see ch01_transformer.ipynb §1.6"
        )

    @classmethod
    def from_hf_config(cls, config: Mapping[str, Any]) -> ModelConfig:
        """Build the config from a Hugging Face ``config.json`` dict.

        Keys: ``vocab_size``, ``hidden_size``, ``intermediate_size``,
        ``num_hidden_layers``, ``num_attention_heads``, ``num_key_value_heads``
        (default: the number of attention heads), ``head_dim`` (default:
        hidden_size // heads), ``max_position_embeddings`` (default 2048),
        ``rope_theta`` — or, in transformers >= 5, ``rope_parameters["rope_theta"]``
        — (default 10000), ``rms_norm_eps`` (default 1e-6), ``tie_word_embeddings``
        (default False), ``model_type`` (default "llama").

        For SmolLM2 the result must equal :meth:`from_gguf`'s. Round floats to
        float32 as there, and call :meth:`validate`.
        """
        raise NotImplementedError(
            "Exercise 1.6 `ModelConfig.from_hf_config`: not implemented yet — see ch01_transformer.ipynb §1.6"
        )

    def validate(self) -> None:
        """Raise ``ConfigError`` with a clear message if the config is impossible.

        Check at least: every size is a positive integer; ``hidden_size`` is
        divisible by ``n_heads``; ``n_heads`` is
        divisible by ``n_kv_heads``; ``head_dim`` is even (RoPE rotates pairs);
        ``rope_theta > 0``; ``0 < rms_norm_eps < 1``. Return None when all is well.
        """
        raise NotImplementedError(
            "Exercise 1.6 `ModelConfig.validate`: not implemented yet — see ch01_transformer.ipynb §1.6"
        )

    def param_counts(self) -> dict[str, int]:
        """Parameters by component, as a dict with exactly these keys:

        ``embedding`` (the token embedding table), ``attention`` (W_q, W_k, W_v,
        W_o of all layers), ``mlp`` (W_gate, W_up, W_down of all layers),
        ``norms`` (two RMSNorm weight vectors per layer plus the final one) and
        ``output`` (the LM head: 0 when embeddings are tied — count it once).
        For SmolLM2-135M the values sum to 134,515,008.
        """
        raise NotImplementedError(
            "Exercise 1.6 `ModelConfig.param_counts`: not implemented yet — see ch01_transformer.ipynb §1.6"
        )

    @property
    def n_params(self) -> int:
        """Total parameter count: the sum of :meth:`param_counts`."""
        raise NotImplementedError(
            "Exercise 1.6 `ModelConfig.n_params`: not implemented yet — see ch01_transformer.ipynb §1.6"
        )

    def weight_bytes(self, fmt: str = "f32") -> int:
        """Bytes of all weights if every matrix is stored as ``fmt`` and norms as f32.

        ``fmt`` is a ggml type name (``f32``, ``f16``, ``bf16``, ``q8_0``, ``q4_0``,
        ``q4_1``, ``q4_k``, ``q6_k``). A block format packs ``block_size`` weights into
        ``type_size`` bytes: look both up with
        ``llmrs_core.quant.types.type_traits(type_by_name(fmt))``.
        Bytes of the matrices: ``n_matrix_weights * type_size // block_size``;
        an unknown ``fmt`` raises ``ValueError``.
        """
        raise NotImplementedError(
            "Exercise 1.6 `ModelConfig.weight_bytes`: not implemented yet — see ch01_transformer.ipynb §1.6"
        )

    def kv_bytes_per_token(self, dtype: str = "f16") -> int:
        """KV-cache bytes one token takes: K and V, in every layer, for every KV head.

        ``dtype`` is ``f32`` (4 bytes), ``f16`` or ``bf16`` (2), ``fp8`` (1) or ``q8_0``
        (34 bytes per 32 values). Anything else raises ``ConfigError``.
        SmolLM2 in f16: 2 * 30 * 3 * 64 * 2 = 23,040 bytes.
        """
        raise NotImplementedError(
            "Exercise 1.6 `ModelConfig.kv_bytes_per_token`: not implemented yet — see ch01_transformer.ipynb §1.6"
        )

    def kv_cache_bytes(self, n_tokens: int, dtype: str = "f16", batch_size: int = 1) -> int:
        """KV-cache bytes for ``batch_size`` sequences of ``n_tokens`` tokens each.

        Negative ``n_tokens`` or ``batch_size`` raise ``ConfigError``.
        """
        raise NotImplementedError(
            "Exercise 1.6 `ModelConfig.kv_cache_bytes`: not implemented yet — see ch01_transformer.ipynb §1.6"
        )

    def flops_per_token(self, context_length: int = 0) -> int:
        """FLOPs to process one token that attends to ``context_length`` earlier tokens.

        Every weight of every matrix-vector product is one multiply and one add:
        2 FLOPs per weight of W_q, W_k, W_v, W_o, W_gate, W_up, W_down in every
        layer, plus the output head (``vocab_size x hidden_size``, tied or not).
        The embedding lookup is free. Attention adds ``q . k`` and ``p . v`` for
        each head and each past token: ``4 * n_layers * n_heads * head_dim *
        context_length``. Leave out norms, RoPE, softmax and SiLU.
        """
        raise NotImplementedError(
            "Exercise 1.6 `ModelConfig.flops_per_token`: not implemented yet — see ch01_transformer.ipynb §1.6"
        )
