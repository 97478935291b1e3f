"""What a quantisation scheme does to the model: size, perplexity and KL divergence (chapter 6, §6.5).

Every block matrix of a model loaded on the NumPy backend (``llmrs.load(path,
backend="numpy")``: float32 weights) is re-quantised into a scheme and dequantised
back; the embedding (the tied output head) keeps the file's bytes unless the scheme
says ``embedding_too``. One forward pass over a fixed text ``ids [T]`` then gives
``T - 1`` next-token distributions, compared with those of the model as loaded
(:func:`reference`):

* ``bytes``: the stored size of every tensor: what the scheme makes of the matrices
  it quantises, the file's ``n_bytes`` for the rest (norm vectors; the embedding);
* ``ppl``: perplexity ``exp(-mean_t log p(ids[t+1] | ids[:t+1]))``;
* ``kl``: ``mean_t sum_v p_ref(v) (log p_ref(v) - log p(v))`` (nats), what
  ``llama-perplexity --kl-divergence`` reports;
* ``top1``: the share of positions whose most likely next token is still the reference's.

The reference is the model as loaded: for SmolLM2, the float32 dequantisation of
its Q4_1 file, so ``q4_1`` re-creates it byte for byte (KL exactly 0) and every
other figure is damage added on top of the file (the chapter's caveat).

    schemes        SCHEMES: name -> Scheme (GGML types, integer schemes, float32)
    reference(model, ids) -> Reference       one forward pass of the model as loaded
    evaluate(model, ids, scheme, ref) -> {"bytes", "ppl", "kl", "top1", "stored_as"}
    table(model, ids, names) -> {name: row}  the chapter's table, with "f32" first

``llmrs bench all``'s ``quant`` benchmark (:class:`~llmrs_core.bench.suite.QuantBench`)
records this table as it is: the figures are deterministic, so they are not repeated.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..logprobs import log_softmax
from . import integer
from .dequant import dequantize
from .ggml_blocks import quantize
from .requantize import target_type_for
from .types import type_by_name

#: a block's weight attributes (:class:`~llmrs_core.model.LayerWeights`) -> llama.cpp's tensor name
MATRICES = {"wq": "attn_q", "wk": "attn_k", "wv": "attn_v", "wo": "attn_output",
            "w_gate": "ffn_gate", "w_up": "ffn_up", "w_down": "ffn_down"}


class Scheme(ABC):
    """How one weight matrix is stored: :meth:`quantise` gives what the model then computes with."""

    #: also quantise the token embedding (and the output head it is tied to); else keep the file's
    embedding_too: bool = False

    @abstractmethod
    def quantise(self, w: np.ndarray) -> tuple[np.ndarray, int]:
        """``w [rows, cols]`` float32 -> (its quantised-then-dequantised values ``[rows, cols]``
        float32, the bytes they are stored in)."""

    @abstractmethod
    def stored_as(self, shape: tuple[int, ...]) -> str:
        """What a matrix of ``shape`` is stored as (``"Q8_0"``, ``"int4 group 32"``), for the table."""


@dataclass(frozen=True)
class Float32(Scheme):
    """The weights as they are, 4 bytes each: the reference's own row (KL exactly 0)."""

    embedding_too: bool = True

    def quantise(self, w: np.ndarray) -> tuple[np.ndarray, int]:
        return w, 4 * w.size

    def stored_as(self, shape: tuple[int, ...]) -> str:
        return "F32"


@dataclass(frozen=True)
class GGML(Scheme):
    """A ggml type (``"q4_0"``, ``"q6_k"`` ...), through the engine's quantisers: rows that do
    not split into its blocks (SmolLM2's 576-wide rows and the 256-weight K-quant super-blocks)
    fall back to Q8_0, as ``llmrs quantize`` does (:func:`~.requantize.target_type_for`)."""

    type_name: str
    embedding_too: bool = False

    def __post_init__(self) -> None:
        type_by_name(self.type_name)  # a ValueError listing the names, now rather than mid-table

    def quantise(self, w: np.ndarray) -> tuple[np.ndarray, int]:
        t = target_type_for(w.shape, type_by_name(self.type_name))
        raw = quantize(w, t)
        return dequantize(raw.reshape(-1), t, w.shape), raw.nbytes

    def stored_as(self, shape: tuple[int, ...]) -> str:
        return target_type_for(shape, type_by_name(self.type_name)).name


@dataclass(frozen=True)
class Integer(Scheme):
    """The integer schemes of §6.2 (:func:`~.integer.quantize`): ``bits``, symmetric or not,
    per tensor / channel / group; int4 codes counted packed two to a byte."""

    bits: int
    symmetric: bool = True
    granularity: str = "tensor"
    group_size: int | None = None
    embedding_too: bool = False

    def __post_init__(self) -> None:
        integer.QuantScheme(self.bits, self.symmetric, self.granularity, self.group_size)  # checks them

    def quantise(self, w: np.ndarray) -> tuple[np.ndarray, int]:
        q = integer.quantize(w, bits=self.bits, symmetric=self.symmetric, granularity=self.granularity,
                             group_size=self.group_size)
        return q.dequantize(), q.nbytes

    def stored_as(self, shape: tuple[int, ...]) -> str:
        how = f"group {self.group_size}" if self.granularity == "group" else f"per {self.granularity}"
        return f"int{self.bits} {'symmetric' if self.symmetric else 'asymmetric'} {how}"


#: the chapter's table, in its order: "f32" is the reference itself
SCHEMES: dict[str, Scheme] = {
    "f32": Float32(),
    "f16": GGML("f16"),
    "q8_0": GGML("q8_0"),
    "int8 per channel": Integer(8, granularity="channel"),
    "q6_k": GGML("q6_k"),
    "q4_k": GGML("q4_k"),
    "q4_1": GGML("q4_1"),
    "q4_0": GGML("q4_0"),
    "int4 group 32": Integer(4, granularity="group", group_size=32),
    "q4_1, embedding too": GGML("q4_1", embedding_too=True),
}


def scheme_named(name: str) -> Scheme:
    """``SCHEMES[name]``, or a ``ValueError`` listing the names."""
    try:
        return SCHEMES[name]
    except KeyError:
        raise ValueError(f"unknown quantisation scheme {name!r}; choose from: {', '.join(SCHEMES)}") from None


@dataclass(frozen=True)
class Reference:
    """The model as loaded on ``ids [T]``: ``log_probs [T - 1, vocab]`` float64 (position t's
    distribution of the token after ``ids[t]``) and ``targets [T - 1]`` (``ids[1:]``)."""

    log_probs: np.ndarray
    targets: np.ndarray

    @property
    def ppl(self) -> float:
        return perplexity(self.log_probs, self.targets)


def log_probs(logits: np.ndarray) -> np.ndarray:
    """``logits [N, vocab]`` -> float64 log-probabilities ``[N, vocab]``, row by row."""
    return np.stack([log_softmax(row) for row in np.asarray(logits)])


def perplexity(lp: np.ndarray, targets: np.ndarray) -> float:
    """``exp(-mean_t lp[t, targets[t]])`` for ``lp [N, vocab]`` log-probabilities, ``targets [N]``."""
    return float(np.exp(-lp[np.arange(len(targets)), targets].mean()))


def kl_divergence(ref: np.ndarray, lp: np.ndarray) -> float:
    """Mean over positions of ``KL(p_ref || p)`` in nats, for log-probabilities ``ref, lp [N, vocab]``."""
    return float(np.mean(np.sum(np.exp(ref) * (ref - lp), axis=-1)))


def _check(model, ids: np.ndarray) -> np.ndarray:
    if model.backend_name != "numpy":
        raise ValueError(f"quantisation is evaluated on the NumPy backend's float32 weights; this model is on "
                         f"{model.backend_name!r}: load it with llmrs.load(path, backend='numpy')")
    ids = np.asarray(ids, dtype=np.int64).reshape(-1)
    if ids.size < 2:
        raise ValueError(f"the text has {ids.size} token(s): perplexity needs at least 2")
    if ids.size - 1 > model.config.context_length:
        raise ValueError(f"{ids.size} tokens are more than the model's context ({model.config.context_length}) + 1")
    return ids


def reference(model, ids: np.ndarray | Sequence[int]) -> Reference:
    """One forward pass of ``model`` (NumPy backend) as loaded over ``ids[:-1]``."""
    ids = _check(model, ids)
    return Reference(log_probs(model.network.forward(ids[:-1])), ids[1:])


def evaluate(model, ids: np.ndarray | Sequence[int], scheme: Scheme | str, ref: Reference | None = None) -> dict:
    """``{"bytes", "ppl", "kl", "top1", "stored_as"}`` of ``model`` with its block matrices (and
    the embedding when ``scheme.embedding_too``) in ``scheme``, on ``ids [T]`` (see the module
    docstring); ``stored_as``: how many matrices each storage got (``{"Q8_0": 180, "Q4_K": 30}``).
    ``ref`` comes from :func:`reference` on the same ids (computed when omitted). The model's
    weights are restored afterwards, also after an error."""
    ids = _check(model, ids)
    scheme = scheme_named(scheme) if isinstance(scheme, str) else scheme
    ref = reference(model, ids) if ref is None else ref
    if not np.array_equal(ref.targets, ids[1:]):
        raise ValueError("the reference was computed on other token ids than these")
    net = model.network
    tied = net.output is net.token_embd
    slots = [(layer, attr, f"blk.{i}.{name}.weight") for i, layer in enumerate(net.layers)
             for attr, name in MATRICES.items()]
    heads = [(net, "token_embd", "token_embd.weight")] + ([] if tied else [(net, "output", "output.weight")])
    originals = [(obj, attr, getattr(obj, attr)) for obj, attr, _ in slots + heads]
    stored: dict[str, int] = {}  # tensor name -> bytes in the scheme, for the tensors it quantises
    stored_as: dict[str, int] = {}
    try:
        for obj, attr, name in slots + (heads if scheme.embedding_too else []):
            w = getattr(obj, attr)
            w_hat, stored[name] = scheme.quantise(w)
            setattr(obj, attr, w_hat)
            kind = scheme.stored_as(w.shape)
            stored_as[kind] = stored_as.get(kind, 0) + 1
        if tied:
            net.output = net.token_embd  # the same table is the output head
        lp = log_probs(net.forward(ids[:-1]))
    finally:
        for obj, attr, w in originals:
            setattr(obj, attr, w)
        if tied:
            net.output = net.token_embd
    unused = {"output.weight"} if tied else set()  # a tied checkpoint may still store one
    n_bytes = sum(stored.get(name, info.n_bytes) for name, info in model.source.tensors.items() if name not in unused)
    return {"bytes": int(n_bytes), "ppl": perplexity(lp, ref.targets), "kl": kl_divergence(ref.log_probs, lp),
            "top1": float(np.mean(lp.argmax(axis=-1) == ref.log_probs.argmax(axis=-1))), "stored_as": stored_as}


def table(model, ids: np.ndarray | Sequence[int], names: Sequence[str] = tuple(SCHEMES)) -> dict[str, dict]:
    """:func:`evaluate` for each scheme of ``names`` against one :func:`reference`, by name."""
    schemes = {name: scheme_named(name) for name in names}
    ref = reference(model, ids)
    return {name: evaluate(model, ids, s, ref) for name, s in schemes.items()}


__all__ = ["GGML", "MATRICES", "SCHEMES", "Float32", "Integer", "Reference", "Scheme", "evaluate",
           "kl_divergence", "log_probs", "perplexity", "reference", "scheme_named", "table"]
