"""Model configuration: the handful of numbers that fix a Llama-family model's shapes.

Introduced in chapter 1 (Exercise 1.6). A ``ModelConfig`` is built from a
GGUF file's metadata or from a Hugging Face ``config.json`` dict; both give
the same config for the same model. From it follow the parameter count,
the bytes the weights take in a given format, the KV-cache bytes per token
and the FLOPs per token.

Shapes used throughout the engine (names as in the fields below)::

    token embedding      [vocab_size, hidden_size]
    W_q                  [n_heads * head_dim, hidden_size]
    W_k, W_v             [n_kv_heads * head_dim, hidden_size]
    W_o                  [hidden_size, n_heads * head_dim]
    W_gate, W_up         [intermediate_size, hidden_size]
    W_down               [hidden_size, intermediate_size]
    RMSNorm weights      [hidden_size]   (two per layer, one final)

Floats (``rope_theta``, ``rms_norm_eps``) are rounded to float32 by both
constructors, because that is how GGUF stores them and how the engine
computes with them; so a GGUF and a ``config.json`` of one model compare equal.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from .families import FAMILIES, HF_MODEL_TYPES, Family, family
from .quant.types import GGMLType, type_by_name, type_traits

if TYPE_CHECKING:
    from .formats.gguf import GGUFFile


class ConfigError(ValueError):
    """A model configuration is missing a value or is impossible. The message says which."""


#: architectures whose math the engine implements (``general.architecture``; see ``families``)
SUPPORTED_ARCHITECTURES = tuple(FAMILIES)


def check_architecture(arch: Any, source: object) -> None:
    """Refuse a model whose architecture the engine does not implement, before reading the
    architecture's own keys: a Falcon file must not run with Llama math, silently."""
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ConfigError(
            f"{source}: architecture {arch!r} is not supported (supported: {', '.join(SUPPORTED_ARCHITECTURES)})"
        )


def check_hf_model_type(model_type: Any, source: object) -> str:
    """The GGUF architecture of a Hugging Face ``model_type`` (``mistral`` -> ``llama``);
    ``ConfigError`` naming it and the supported ones otherwise."""
    if model_type not in HF_MODEL_TYPES:
        raise ConfigError(
            f"{source}: model_type {model_type!r} is not supported (supported: {', '.join(HF_MODEL_TYPES)})"
        )
    return HF_MODEL_TYPES[model_type]


# bytes per cached K or V element, by cache dtype
KV_DTYPE_BYTES: dict[str, float] = {"f32": 4, "f16": 2, "bf16": 2, "fp8": 1, "q8_0": 34 / 32}


def _f32(x: float) -> float:
    with np.errstate(over="ignore"):  # past float32's range: infinity, which validate() refuses by name
        return float(np.float32(x))


def _number(value: Any, key: str, source: object, integer: bool) -> Any:
    """``value`` of metadata ``key`` as an int (``integer``) or a float; ``ConfigError`` naming the
    key otherwise. An integer may be written as an integral float (``2048.0``), never as a string,
    a bool or a non-finite number (``1e400`` in JSON reads as infinity)."""
    kind = "an integer" if integer else "a number"
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ConfigError(f"{source}: {key!r} must be {kind}, got {type(value).__name__} {value!r}")
    if isinstance(value, (int, np.integer)):
        return int(value) if integer else _checked_float(int(value), key, source)
    if not np.isfinite(value):
        raise ConfigError(f"{source}: {key!r} must be a finite number, got {value!r}")
    if integer:
        if value != int(value):
            raise ConfigError(f"{source}: {key!r} must be an integer, got {value!r}")
        return int(value)
    return float(value)


def _checked_float(value: int, key: str, source: object) -> float:
    try:
        return float(value)
    except OverflowError:  # an integer too large for a float
        raise ConfigError(f"{source}: {key!r} must be a finite number, got an integer of "
                          f"{len(str(value))} digits") from None


def _hf_rope_theta(config: Mapping[str, Any]) -> float:
    """transformers < 5 writes ``rope_theta``; 5 moved it into ``rope_parameters``."""
    if config.get("rope_theta") is not None:
        return _number(config["rope_theta"], "rope_theta", "config.json", integer=False)
    params = config.get("rope_parameters") or {}
    if not isinstance(params, Mapping):
        raise ConfigError(f"config.json: 'rope_parameters' must be an object, got {type(params).__name__}")
    if isinstance(params.get("full_attention"), Mapping):  # Gemma 3: one set per layer type
        params = params["full_attention"]
    return _number(params.get("rope_theta", 10000.0), "rope_parameters.rope_theta", "config.json", integer=False)


#: how many digits a layer number in a tensor name may have (``blk.N.``); longer is no layer
_MAX_LAYER_DIGITS = 18


def check_layer_count(n_layers: int, tensor_names: Iterable[str], key: str, source: object) -> None:
    """Refuse a layer count that the weights cannot hold, before anything is built per layer.

    ``tensor_names`` are GGUF-style (``blk.N.attn_q.weight``). A model of ``n_layers`` layers needs
    tensors of layers ``0 .. n_layers - 1``, so ``n_layers`` must be at most the number of distinct
    layers the file has tensors for: a damaged ``block_count`` (one flipped bit makes 30 into
    67,108,894) is refused here in O(tensors), not after the engine has listed 9 tensor names per
    layer it believes in. ``ConfigError`` names ``key`` and both numbers. (A count *below* the
    file's layers is ``check_tensors``'s to report: the file then has tensors the model ignores.)
    """
    layers = set()
    for name in tensor_names:
        part = name.split(".", 2)
        if len(part) == 3 and part[0] == "blk" and part[1].isdigit() and len(part[1]) <= _MAX_LAYER_DIGITS:
            layers.add(int(part[1]))
    if n_layers > len(layers):
        held = (f"{len(layers):,} layers (blk.{min(layers)} .. blk.{max(layers)})" if layers
                else "no layer (no blk.N.* tensor)")
        raise ConfigError(
            f"{source}: {key} is {n_layers:,}, but the weights hold tensors of {held}: "
            "the layer count is damaged or the weights are incomplete"
        )


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
        architecture: model family, as GGUF's ``general.architecture`` names it
            (:mod:`llmrs_core.families`: the switches it turns on).

    The fields below are the numbers a family's file may set; their defaults are Llama's
    (SmolLM2 has every one at its default):

        qkv_bias: W_q, W_k and W_v have biases (``attn_{q,k,v}.bias``).
        rotary_dim: dimensions of each head that RoPE rotates; 0 means all of ``head_dim``
            (Phi-4-mini rotates 3/4; the rest pass through).
        rope_scale: linear RoPE scaling: positions are divided by it.
        rope_original_context: longrope (Phi-3): sequences up to this length use the short
            frequency factors, longer ones the long factors; 0 when the file has none.
        rope_attn_factor: longrope's multiplier of cos and sin.
        rope_theta_swa: the RoPE base of sliding-window layers (Gemma 3's local base).
        sliding_window: keys further back than this many positions are hidden, in the
            layers listed in ``swa_layers``; 0 when no layer slides.
        swa_layers: indices of the sliding-window layers.
        attn_softcap: attention scores become ``c * tanh(s / c)`` (Gemma 2); 0 is off.
        final_softcap: the same for the output logits (Gemma 2, some Gemma 3); 0 is off.
        attn_scale: the factor of q.k; 0 means ``1 / sqrt(head_dim)``.
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
        """The switches of this config's architecture (:mod:`llmrs_core.families`)."""
        return family(self.architecture)

    @property
    def rope_dims(self) -> int:
        """How many dimensions of each head RoPE rotates (``rotary_dim``, or all of them)."""
        return self.rotary_dim or self.head_dim

    # -- constructors ------------------------------------------------------

    @classmethod
    def from_gguf(cls, gguf: GGUFFile) -> ModelConfig:
        """Build the config from a parsed GGUF file (``llmrs_core.formats.gguf.read_gguf``).

        Reads ``general.architecture`` and the ``{arch}.*`` keys
        (``block_count``, ``embedding_length``, ``feed_forward_length``,
        ``attention.head_count``, ``attention.head_count_kv``, ...).
        Embeddings are tied when the file has no ``output.weight`` tensor.
        """
        md = gguf.metadata

        def need(key: str) -> Any:
            if key not in md:
                raise ConfigError(f"{gguf.path}: GGUF metadata lacks {key!r}")
            return md[key]

        def need_int(key: str) -> int:
            value = need(key)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ConfigError(
                    f"{gguf.path}: GGUF metadata {key!r} must be an integer, got {type(value).__name__} {value!r}"
                )
            return value

        def opt_int(key: str, default: int) -> int:
            return need_int(key) if key in md else default

        def need_float(key: str, default: float | None = None) -> float:
            value = need(key) if default is None else md.get(key, default)
            return _number(value, key, gguf.path, integer=False)

        arch = need("general.architecture")
        hidden = need_int(f"{arch}.embedding_length")
        n_heads = need_int(f"{arch}.attention.head_count")
        if n_heads <= 0:  # before anything divides by it
            raise ConfigError(f"{gguf.path}: GGUF metadata '{arch}.attention.head_count' must be a positive "
                              f"integer, got {n_heads}")
        if hidden % n_heads and f"{arch}.attention.key_length" not in md:
            raise ConfigError(
                f"hidden size {hidden} is not divisible by the {n_heads} attention heads"
            )
        if f"{arch}.vocab_size" in md:
            vocab = need_int(f"{arch}.vocab_size")
        elif "tokenizer.ggml.tokens" in md:
            vocab = len(md["tokenizer.ggml.tokens"])
        elif "token_embd.weight" in gguf.tensors:
            vocab = gguf.tensors["token_embd.weight"].shape[0]
        else:
            raise ConfigError(
                f"{gguf.path}: cannot tell the vocabulary size (no {arch}.vocab_size, "
                "no tokenizer.ggml.tokens, no token_embd.weight)"
            )
        n_layers = need_int(f"{arch}.block_count")
        head_dim = opt_int(f"{arch}.attention.key_length", hidden // n_heads)
        rope_theta = _f32(need_float(f"{arch}.rope.freq_base", 10000.0))
        context = need_int(f"{arch}.context_length")
        extra = {}
        if arch in FAMILIES:  # another architecture's config is still readable (check_architecture refuses it)
            from .family_config import gguf_family_fields

            extra = gguf_family_fields(md, gguf.tensors, family(arch), n_layers=n_layers, hidden=hidden,
                                       n_heads=n_heads, head_dim=head_dim, rope_theta=rope_theta,
                                       context=context, source=gguf.path)
        config = cls(
            vocab_size=int(vocab),
            hidden_size=int(hidden),
            intermediate_size=need_int(f"{arch}.feed_forward_length"),
            n_layers=n_layers,
            n_heads=int(n_heads),
            n_kv_heads=opt_int(f"{arch}.attention.head_count_kv", n_heads),
            head_dim=head_dim,
            context_length=context,
            rope_theta=rope_theta,
            rms_norm_eps=_f32(need_float(f"{arch}.attention.layer_norm_rms_epsilon")),
            tie_embeddings="output.weight" not in gguf.tensors,
            architecture=str(arch),
            **extra,
        )
        config.validate()
        return config

    @classmethod
    def from_hf_config(cls, config: Mapping[str, Any]) -> ModelConfig:
        """Build the config from a Hugging Face ``config.json`` (as a dict).

        Uses transformers' ``LlamaConfig`` defaults for keys that are absent
        (``num_key_value_heads`` = ``num_attention_heads``, ``rope_theta`` = 1e4,
        read from ``rope_parameters`` in transformers >= 5 configs,
        ``rms_norm_eps`` = 1e-6, ``tie_word_embeddings`` = False).
        """

        def need(key: str) -> Any:
            if key not in config:
                raise ConfigError(f"config.json lacks {key!r}")
            return config[key]

        def need_int(key: str) -> int:
            return _number(need(key), key, "config.json", integer=True)

        def opt_int(key: str, default: int) -> int:
            value = config.get(key)
            return default if value is None else _number(value, key, "config.json", integer=True)

        def opt_float(key: str, default: float) -> float:
            value = config.get(key)
            return default if value is None else _number(value, key, "config.json", integer=False)

        hidden = need_int("hidden_size")
        n_heads = need_int("num_attention_heads")
        if n_heads <= 0:  # before anything divides by it
            raise ConfigError(f"config.json: 'num_attention_heads' must be a positive integer, got {n_heads}")
        if "head_dim" in config and config["head_dim"] is not None:
            head_dim = need_int("head_dim")
        elif hidden % n_heads:
            raise ConfigError(
                f"hidden size {hidden} is not divisible by the {n_heads} attention heads"
            )
        else:
            head_dim = hidden // n_heads
        model_type = config.get("model_type", "llama")
        arch = HF_MODEL_TYPES.get(model_type, model_type)
        n_layers = need_int("num_hidden_layers")
        context = opt_int("max_position_embeddings", 2048)
        rope_theta = _f32(_hf_rope_theta(config))
        extra = {}
        if arch in FAMILIES:
            from .family_config import hf_family_fields

            extra = hf_family_fields(config, family(arch), n_layers=n_layers, hidden=hidden, n_heads=n_heads,
                                     head_dim=head_dim, rope_theta=rope_theta, context=context)
        result = cls(
            vocab_size=need_int("vocab_size"),
            hidden_size=hidden,
            intermediate_size=need_int("intermediate_size"),
            n_layers=n_layers,
            n_heads=n_heads,
            n_kv_heads=opt_int("num_key_value_heads", n_heads) or n_heads,
            head_dim=head_dim,
            context_length=context,
            rope_theta=rope_theta,
            rms_norm_eps=_f32(opt_float("rms_norm_eps", 1e-6)),
            tie_embeddings=bool(config.get("tie_word_embeddings", False)),
            architecture=str(arch),
            **extra,
        )
        result.validate()
        return result

    # -- validation --------------------------------------------------------

    def validate(self) -> None:
        """Raise ``ConfigError`` naming the first impossible value; return None if all is well."""
        for name in (
            "vocab_size", "hidden_size", "intermediate_size", "n_layers",
            "n_heads", "n_kv_heads", "head_dim", "context_length",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        if self.hidden_size % self.n_heads:
            raise ConfigError(
                f"hidden_size {self.hidden_size} is not divisible by n_heads {self.n_heads}"
            )
        # n_heads * head_dim may differ from hidden_size: Qwen3, Gemma and Mistral Nemo project the
        # width to heads of their own size (GGUF's attention.key_length, config.json's head_dim)
        if self.n_heads % self.n_kv_heads:
            raise ConfigError(
                f"{self.n_heads} query heads cannot be shared evenly by {self.n_kv_heads} "
                "KV heads (grouped-query attention needs n_heads % n_kv_heads == 0)"
            )
        if self.head_dim % 2:
            raise ConfigError(f"head_dim {self.head_dim} is odd; RoPE rotates pairs of dimensions")
        if not (self.rope_theta > 0 and np.isfinite(self.rope_theta)):
            raise ConfigError(f"rope_theta must be a positive number, got {self.rope_theta!r}")
        if not 0 < self.rms_norm_eps < 1:
            raise ConfigError(f"rms_norm_eps must be in (0, 1), got {self.rms_norm_eps!r}")
        self._validate_family_fields()

    def _validate_family_fields(self) -> None:
        """The family fields (see the class docstring) are within what the forward pass can run."""
        if not (0 <= self.rotary_dim <= self.head_dim and self.rotary_dim % 2 == 0):
            raise ConfigError(f"rotary_dim must be an even number of at most head_dim ({self.head_dim}), "
                              f"got {self.rotary_dim!r}")
        for name in ("rope_scale", "rope_attn_factor"):
            value = getattr(self, name)
            if not (value > 0 and np.isfinite(value)):
                raise ConfigError(f"{name} must be a positive number, got {value!r}")
        for name in ("rope_theta_swa", "attn_softcap", "final_softcap", "attn_scale"):
            value = getattr(self, name)
            if not (value >= 0 and np.isfinite(value)):
                raise ConfigError(f"{name} must be a non-negative number (0: off), got {value!r}")
        if self.sliding_window < 0 or self.rope_original_context < 0:
            raise ConfigError("sliding_window and rope_original_context must be >= 0")
        if any(not 0 <= i < self.n_layers for i in self.swa_layers):
            raise ConfigError(f"swa_layers must be layer indices below {self.n_layers}, got {self.swa_layers!r:.80}")

    # -- sizes ---------------------------------------------------------------

    def param_counts(self) -> dict[str, int]:
        """Parameters by component; tied embeddings are counted once (``output`` is 0).

        Keys: ``embedding``, ``attention`` (W_q, W_k, W_v, W_o of all layers),
        ``mlp`` (W_gate, W_up, W_down of all layers), ``norms`` (2 per layer
        + final), ``output`` (the LM head, when not tied). A family's extras count where they
        belong: q/k/v biases in ``attention``, Gemma's two more norms and q/k norms in ``norms``.
        """
        d, hd = self.hidden_size, self.head_dim
        q_out, kv_out = self.n_heads * hd, self.n_kv_heads * hd
        per_layer_attn = d * q_out + 2 * d * kv_out + q_out * d
        if self.qkv_bias:  # a family's extras (Qwen2's biases, Gemma's extra norms, q/k norms)
            per_layer_attn += q_out + 2 * kv_out
        per_layer_mlp = 3 * d * self.intermediate_size
        fam = self.family if self.architecture in FAMILIES else None
        per_layer_norms = (4 if fam and fam.sandwich_norms else 2) * d + (2 * hd if fam and fam.qk_norm else 0)
        return {
            "embedding": self.vocab_size * d,
            "attention": self.n_layers * per_layer_attn,
            "mlp": self.n_layers * per_layer_mlp,
            "norms": self.n_layers * per_layer_norms + d,
            "output": 0 if self.tie_embeddings else self.vocab_size * d,
        }

    @property
    def n_params(self) -> int:
        """Total parameter count (the sum of :meth:`param_counts`)."""
        return sum(self.param_counts().values())

    def weight_bytes(self, fmt: str = "f32") -> int:
        """Bytes of all weights with every matrix stored as ``fmt`` and norms in f32.

        ``fmt`` is a ggml type name: ``f32``, ``f16``, ``bf16``, ``q8_0``,
        ``q4_0``, ``q4_1``, ``q4_k``, ``q6_k``, ... A block format of ``block_size``
        weights in ``type_size`` bytes costs ``type_size / block_size`` bytes a weight
        (Q4_1: 20 / 32 = 0.625, i.e. 5 bits).
        """
        traits = type_traits(type_by_name(fmt))
        counts = self.param_counts()
        matrices = self.n_params - counts["norms"]
        norm_bytes = counts["norms"] * type_traits(GGMLType.F32).type_size
        return matrices * traits.type_size // traits.block_size + norm_bytes

    def kv_bytes_per_token(self, dtype: str = "f16") -> int:
        """KV-cache bytes one token takes: K and V, every layer, every KV head.

        ``2 * n_layers * n_kv_heads * head_dim * bytes(dtype)``; ``dtype`` is one of
        ``f32``, ``f16``, ``bf16``, ``fp8``, ``q8_0``.
        """
        if dtype not in KV_DTYPE_BYTES:
            raise ConfigError(f"unknown KV-cache dtype {dtype!r}; choose one of {sorted(KV_DTYPE_BYTES)}")
        elements = 2 * self.n_layers * self.n_kv_heads * self.head_dim
        return int(elements * KV_DTYPE_BYTES[dtype])

    def kv_cache_bytes(self, n_tokens: int, dtype: str = "f16", batch_size: int = 1) -> int:
        """KV-cache bytes for ``batch_size`` sequences of ``n_tokens`` tokens each."""
        if n_tokens < 0 or batch_size < 0:
            raise ConfigError(f"n_tokens and batch_size must be >= 0, got {n_tokens}, {batch_size}")
        return self.kv_bytes_per_token(dtype) * n_tokens * batch_size

    def flops_per_token(self, context_length: int = 0) -> int:
        """Floating-point operations to process one token attending to ``context_length`` tokens.

        Each weight of a matrix-vector product costs a multiply and an add
        (2 FLOPs); the embedding lookup costs none, but the output head (tied
        or not) is a ``vocab_size x hidden_size`` product. Attention adds
        ``q . k`` and ``p . v`` for every head and past token:
        ``4 * n_layers * n_heads * head_dim * context_length``. Norms, RoPE,
        softmax and SiLU are lower-order and left out.
        """
        counts = self.param_counts()
        matmul_params = counts["attention"] + counts["mlp"] + self.vocab_size * self.hidden_size
        attention = 4 * self.n_layers * self.n_heads * self.head_dim * context_length
        return 2 * matmul_params + attention
