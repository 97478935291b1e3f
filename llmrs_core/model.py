"""The Llama forward pass, written once against the backend interface (chapter 4).

For token ids ``[T]`` at positions ``start .. start + T - 1``::

    x = embed(ids)                                          [T, d]
    for each block:
        h = rms_norm(x, attn_norm)
        q, k, v = h Wq^T, h Wk^T, h Wv^T                     [T, Hq, D], [T, Hkv, D]
        q, k = rope(q), rope(k)
        x = x + attention(q, cached k, cached v) Wo^T
        h = rms_norm(x, ffn_norm)
        x = x + (silu(h Wg^T) * h Wu^T) Wd^T
    logits = rms_norm(x, output_norm) W_out^T                [T, vocab]

Tensor names are llama.cpp's (``blk.N.attn_q.weight``, ...). With tied
embeddings ``W_out`` is the token embedding table.

The other families (appendix B; :mod:`llmrs_core.families`) run the same loop with their
switches on: q/k/v biases (Qwen2), a per-head RMSNorm of q and k before RoPE (Qwen3, Gemma 3),
fused Q/K/V and gate/up matrices (Phi-3), RoPE that is partial, scaled or per layer
(:class:`~llmrs_core.rope.Rotary`), attention with a sliding window, a soft-cap or its own
scale (:class:`~llmrs_core.attention.AttentionOptions`), Gemma's scaled embedding, GeGLU,
norms after attention and MLP, and a soft-capped output. Each is one ``if`` beside the line
it changes; SmolLM2 takes none of them.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .attention import PLAIN, AttentionOptions
from .backends.base import Backend
from .config import ModelConfig
from .distributed.plan import SingleProcess, StepPlan
from .formats.source import WeightSource
from .kv_cache.base import KVCache
from .kv_cache.contiguous import ContiguousKVCache
from .kv_cache.paged import PagedKVCache
from .rope import Rotary
from .step import StepBatch, prepare_step


@dataclass
class LayerWeights:
    """One decoder block's weights, as prepared by the backend, and how it attends.

    The fields after ``w_down`` are a family's (None: the family has none); a fused matrix
    (Phi-3's ``wqkv`` = [W_q; W_k; W_v] rows, ``w_gate_up`` = [W_gate; W_up]) stands in place
    of its parts, which are then None."""

    attn_norm: np.ndarray
    wq: Any
    wk: Any
    wv: Any
    wo: Any
    ffn_norm: np.ndarray
    w_gate: Any
    w_up: Any
    w_down: Any
    rotary: Rotary | None = None
    attn: AttentionOptions = PLAIN
    bq: np.ndarray | None = None
    bk: np.ndarray | None = None
    bv: np.ndarray | None = None
    q_norm: np.ndarray | None = None
    k_norm: np.ndarray | None = None
    post_attn_norm: np.ndarray | None = None
    post_ffn_norm: np.ndarray | None = None
    wqkv: Any = None
    w_gate_up: Any = None


def fused(source: WeightSource, c: ModelConfig, what: str) -> bool:
    """Whether ``source`` stores ``what`` ("qkv" or "gate_up") fused, as Phi-3's files do."""
    f = c.family
    if what == "qkv":
        return f.fused_qkv and "blk.0.attn_qkv.weight" in source.tensors
    return f.fused_gate_up and "blk.0.ffn_gate.weight" not in source.tensors


def expected_tensors(source: WeightSource, c: ModelConfig,
                     vocab_rows: int | None = None) -> tuple[dict[str, tuple], dict[str, tuple]]:
    """``(required, optional)``: tensor name -> shape, for the family of config ``c``."""
    f = c.family
    d, hd, ff = c.hidden_size, c.head_dim, c.intermediate_size
    q_out, kv_out = c.n_heads * hd, c.n_kv_heads * hd
    v = c.vocab_size if vocab_rows is None else vocab_rows
    want = {"token_embd.weight": (v, d), "output_norm.weight": (d,)}
    # a tied checkpoint may still store its output matrix (Hugging Face's lm_head): unused, harmless
    optional = {"output.weight": (v, d)} if c.tie_embeddings else {}
    if not c.tie_embeddings:
        want["output.weight"] = (v, d)
    half = c.rope_dims // 2
    optional |= {"rope_freqs.weight": (half,), "rope_factors_long.weight": (half,),
                 "rope_factors_short.weight": (half,)}
    qkv, gate_up = fused(source, c, "qkv"), fused(source, c, "gate_up")
    for i in range(c.n_layers):
        p = f"blk.{i}."
        want |= {p + "attn_norm.weight": (d,), p + "attn_output.weight": (d, q_out),
                 p + "ffn_norm.weight": (d,), p + "ffn_down.weight": (d, ff)}
        if qkv:
            want[p + "attn_qkv.weight"] = (q_out + 2 * kv_out, d)
        else:
            want |= {p + "attn_q.weight": (q_out, d), p + "attn_k.weight": (kv_out, d),
                     p + "attn_v.weight": (kv_out, d)}
        if c.qkv_bias:
            want |= {p + "attn_q.bias": (q_out,), p + "attn_k.bias": (kv_out,), p + "attn_v.bias": (kv_out,)}
        if f.qk_norm:
            want |= {p + "attn_q_norm.weight": (hd,), p + "attn_k_norm.weight": (hd,)}
        if f.sandwich_norms:
            want |= {p + "post_attention_norm.weight": (d,), p + "post_ffw_norm.weight": (d,)}
        if gate_up:
            want[p + "ffn_up.weight"] = (2 * ff, d)
        else:
            want |= {p + "ffn_gate.weight": (ff, d), p + "ffn_up.weight": (ff, d)}
    return want, optional


def check_tensors(gguf: WeightSource, c: ModelConfig, vocab_rows: int | None = None) -> None:
    """Every tensor the forward pass reads exists with the shape the config ``c`` implies, and
    the source has no tensor the model would ignore (a wrong block count, another architecture).
    ``vocab_rows``: rows of the embedding table and output head, when a tensor-parallel shard
    holds only part of the vocabulary (chapter 11); default ``c.vocab_size``."""
    want, optional = expected_tensors(gguf, c, vocab_rows)
    extra = sorted(set(gguf.tensors) - set(want) - set(optional))
    if extra:
        layers = sorted({int(n.split(".")[1]) for n in extra if n.startswith("blk.") and n.split(".")[1].isdigit()})
        hint = (
            f"; the block count is {c.n_layers}, but the file has tensors of layer {layers[-1]}: "
            "is the block count right?" if layers and layers[-1] >= c.n_layers else ""
        )
        shown = ", ".join(extra[:4]) + (f" and {len(extra) - 4} more" if len(extra) > 4 else "")
        raise ValueError(f"{gguf.path}: tensors the model does not use: {shown}{hint}")
    for name in want:
        if name not in gguf.tensors:
            raise ValueError(f"{gguf.path}: the model needs tensor {name!r}, which the file lacks")
    for name, shape in (want | optional).items():
        if name in gguf.tensors and gguf.tensors[name].shape != shape:
            raise ValueError(
                f"{gguf.path}: tensor {name!r} has shape {gguf.tensors[name].shape}, "
                f"the config implies {shape}"
            )
    if "rope_factors_long.weight" in gguf.tensors and "rope_factors_short.weight" not in gguf.tensors:
        raise ValueError(f"{gguf.path}: the file has rope_factors_long.weight but not rope_factors_short.weight")


def resident_bytes(source: WeightSource, backend: str) -> int:
    """About the host memory the weights of ``source`` take once loaded on ``backend``: float32
    for the NumPy backends (4 bytes a weight); the stored bytes plus an int8 copy (just over
    a byte a weight) for Numba's; nothing for a GPU's. So that a model too big for the machine
    is refused with the numbers before any weight is read, not killed by the kernel halfway."""
    elements = sum(t.n_elements for t in source.tensors.values())
    if backend in ("numpy", "learner"):
        return 4 * elements
    if backend == "numba":
        return sum(t.n_bytes for t in source.tensors.values()) + elements * 34 // 32
    return 0


class NonFiniteError(FloatingPointError):
    """The forward pass produced NaN or infinite logits: valid weights and token ids never do."""


class LlamaModel:
    """A Llama-family transformer loaded onto a backend.

    ``source`` is a :class:`~llmrs_core.formats.source.WeightSource`: a GGUF
    file, or a Hugging Face directory (chapter 10), whose ``rope_layout`` the
    backend learns in :meth:`~llmrs_core.backends.base.Backend.prepare`.

    ``plan`` splits each step across processes (chapter 11): the default is one process;
    a tensor- or pipeline-parallel rank gets a shard as ``source`` (its own, smaller
    ``config``) and a :class:`~llmrs_core.distributed.plan.StepPlan` that communicates.

    ``kv_cache`` builds :meth:`new_cache`'s caches, as ``kv_cache(config, max_tokens, xp=xp)``: the
    engine's :class:`~llmrs_core.kv_cache.contiguous.ContiguousKVCache` unless ``load()`` gives
    another (the learner's Exercise 5.6 cache, wrapped in its checks: ``Model.parts``).
    """

    def __init__(self, source: WeightSource, config: ModelConfig, backend: Backend,
                 plan: StepPlan | None = None, vocab_rows: int | None = None,
                 kv_cache: Callable[..., KVCache] = ContiguousKVCache):
        self.config = config
        self.kv_cache = kv_cache
        self.family = config.family
        self.backend = backend
        self.plan = SingleProcess() if plan is None else plan
        self.source_path = source.path  # for messages that blame the weights
        check_tensors(source, config, vocab_rows)
        backend.prepare(source)
        b, gguf = backend, source
        self.token_embd = b.load_matrix(gguf, "token_embd.weight")
        rotaries = self._rotaries(gguf)
        self.layers = [self._load_layer(gguf, i, rotaries) for i in range(config.n_layers)]
        self.output_norm = b.load_vector(gguf, "output_norm.weight")
        self.output = self.token_embd if config.tie_embeddings else b.load_matrix(gguf, "output.weight")
        #: the backend's compiled layer loop for decode steps (chapter 8), or None: one process only
        self.decode = b.decode_program(self.layers, config) if plan is None else None

    def _rotaries(self, source: WeightSource) -> dict[str, Rotary]:
        """The RoPE of the global layers and of the sliding-window ones (appendix B): Llama's
        plain one, or with Llama 3's ``rope_freqs``, Phi-3's longrope factors, linear scaling,
        Gemma 3's local base."""
        c = self.config
        base = {"theta": c.rope_theta, "dims": c.rope_dims, "scale": c.rope_scale}
        if "rope_factors_long.weight" in source.tensors:
            long = Rotary(**base, factors=source.float32("rope_factors_long.weight"), mscale=c.rope_attn_factor)
            rotary = Rotary(**base, factors=source.float32("rope_factors_short.weight"), mscale=c.rope_attn_factor,
                            long=long, original=c.rope_original_context)
        elif "rope_freqs.weight" in source.tensors:
            rotary = Rotary(**base, factors=source.float32("rope_freqs.weight"))
        else:
            rotary = Rotary(**base)
        return {"global": rotary, "local": Rotary(c.rope_theta_swa or c.rope_theta, c.rope_dims)}

    def _load_layer(self, gguf: WeightSource, i: int, rotaries: dict[str, Rotary]) -> LayerWeights:
        b, c, p = self.backend, self.config, f"blk.{i}."
        f = self.family

        def vector(name: str, present: bool) -> np.ndarray | None:
            return b.load_vector(gguf, p + name) if present else None

        sliding = c.sliding_window > 0 and i in c.swa_layers
        layer = LayerWeights(
            attn_norm=b.load_vector(gguf, p + "attn_norm.weight"),
            wq=None, wk=None, wv=None,
            wo=b.load_matrix(gguf, p + "attn_output.weight"),
            ffn_norm=b.load_vector(gguf, p + "ffn_norm.weight"),
            w_gate=None, w_up=None,
            w_down=b.load_matrix(gguf, p + "ffn_down.weight"),
            rotary=rotaries["local" if sliding else "global"],
            attn=AttentionOptions(window=c.sliding_window if sliding else 0, softcap=c.attn_softcap,
                                  scale=c.attn_scale),
            bq=vector("attn_q.bias", c.qkv_bias), bk=vector("attn_k.bias", c.qkv_bias),
            bv=vector("attn_v.bias", c.qkv_bias),
            q_norm=vector("attn_q_norm.weight", f.qk_norm), k_norm=vector("attn_k_norm.weight", f.qk_norm),
            post_attn_norm=vector("post_attention_norm.weight", f.sandwich_norms),
            post_ffn_norm=vector("post_ffw_norm.weight", f.sandwich_norms),
        )
        # Q/K/V and gate/up multiply the same input: loaded together, a backend may fuse them
        if fused(gguf, c, "qkv"):
            layer.wqkv = b.load_matrix(gguf, p + "attn_qkv.weight")
        else:
            layer.wq, layer.wk, layer.wv = b.load_matrices(
                gguf, [p + "attn_q.weight", p + "attn_k.weight", p + "attn_v.weight"])
        if fused(gguf, c, "gate_up"):
            layer.w_gate_up = b.load_matrix(gguf, p + "ffn_up.weight")
        else:
            layer.w_gate, layer.w_up = b.load_matrices(gguf, [p + "ffn_gate.weight", p + "ffn_up.weight"])
        return layer

    def new_cache(self, max_tokens: int) -> KVCache:
        """A contiguous cache for ``max_tokens`` positions, in the backend's array module, built by
        :attr:`kv_cache` (the engine's ``ContiguousKVCache``, or the learner's Exercise 5.6 cache)."""
        return self.kv_cache(self.config, max_tokens, xp=self.backend.xp)

    def warm_up(self) -> float:
        """Run one throwaway step of each of the backend's :attr:`~Backend.warm_up_sizes`, so
        that every kernel is compiled (or loaded from Numba's cache) before anything is
        timed. Returns the seconds it took; 0.0 for a backend that compiles nothing."""
        start = time.perf_counter()
        for n in self.backend.warm_up_sizes:
            self.forward(np.zeros(n, dtype=np.int64), last_only=True)
        if self.backend.warm_up_sizes:  # and a decode token in the engine's paged pool (its own kernel)
            pool = PagedKVCache(self.config, num_blocks=1, block_size=1, xp=self.backend.xp)
            self.forward([0], pool.sequence(0), last_only=True)
        return time.perf_counter() - start if self.backend.warm_up_sizes else 0.0

    def forward(
        self, ids: np.ndarray | list[int], cache: KVCache | None = None, last_only: bool = False
    ) -> np.ndarray:
        """Logits ``[T, vocab]`` for ``ids [T]`` (``[1, vocab]`` with ``last_only``).

        With a ``cache`` (any :class:`~llmrs_core.kv_cache.base.KVCache`: the
        contiguous cache, a paged sequence, an evicting cache) the ids continue
        the cached sequence and their K/V are added to it; without one, the ids
        are a whole sequence from position 0.
        """
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        if cache is None:
            cache = self.new_cache(max(ids.size, 1))
        return self.forward_batch([(ids, cache)], last_only=last_only)[0]

    def forward_batch(
        self, batch: list[tuple[np.ndarray | list[int], KVCache]], last_only: bool = True
    ) -> list[np.ndarray]:
        """One step for several sequences at once (chapter 7's continuous batching).

        ``batch`` holds ``(ids, cache)`` pairs: each sequence's new tokens (a
        prefill chunk or one decode token) and its cache. All the tokens go
        through the weight matrices together — ``[sum of T, d]`` — so each
        weight is read once per step, not once per sequence; attention runs
        per sequence over its own cache, except that the decode tokens of
        sequences in the engine's own paged pool (``kv_cache.paged.decode_group``)
        are written and attended in one backend call per layer
        (:meth:`Backend.paged_decode_attention`). Returns each sequence's logits:
        ``[1, vocab]`` (its last token) with ``last_only``, else ``[T, vocab]``.
        """
        c, b, p = self.config, self.backend, self.plan  # p: the identity in one process
        step = prepare_step(batch, c.vocab_size)  # n rows: every sequence's new tokens
        b.begin_step(step.n, step.sizes)
        x = p.embed(b, self.token_embd, step.ids)                          # [n, d]
        if self.family.embed_scale:  # Gemma
            x = x * np.float32(math.sqrt(c.hidden_size))
        # a decode step may run compiled, the same operations as the loop below in one call
        compiled = self.decode.run(x, step) if self.decode is not None else None
        x = compiled if compiled is not None else self._layers(x, step)   # [n, d]
        logits = p.logits(x, step.last_rows if last_only else None, self._head)
        self._check_finite(logits)
        # Only a step that succeeded moves the caches on: after a failure (here or in any
        # operation above) every cache is as it was, and the step can be run again.
        for cache, t in zip(step.caches, step.sizes):
            cache.advance(t)
        bounds = step.bounds
        if last_only:
            return [logits[j : j + 1] for j in range(len(batch))]
        return [logits[bounds[j] : bounds[j + 1]] for j in range(len(batch))]

    def _layers(self, x: Any, step: StepBatch) -> Any:
        """Every decoder block, one after another: ``x [n, d]`` -> ``[n, d]``."""
        c, b, p = self.config, self.backend, self.plan
        for i, layer in enumerate(self.layers):
            h = b.rms_norm(x, layer.attn_norm, c.rms_norm_eps)            # [n, d]
            q, k, v = self._qkv(h, layer)                                 # [n, Hq, D], [n, Hkv, D] x2
            attended = self._attention(i, layer, q, k, v, step)           # [n, Hq * D]
            out = p.reduce(b.matmul(attended, layer.wo))                  # [n, d]
            if layer.post_attn_norm is not None:  # Gemma
                out = b.rms_norm(out, layer.post_attn_norm, c.rms_norm_eps)
            x = x + out
            h = b.rms_norm(x, layer.ffn_norm, c.rms_norm_eps)             # [n, d]
            out = p.reduce(b.matmul(self._gated(h, layer), layer.w_down))  # [n, ff] -> [n, d]
            if layer.post_ffn_norm is not None:  # Gemma
                out = b.rms_norm(out, layer.post_ffn_norm, c.rms_norm_eps)
            x = x + out
        return x

    def _qkv(self, h: Any, layer: LayerWeights) -> tuple[Any, Any, Any]:
        """``h [n, d]`` -> ``q [n, Hq, D]``, ``k, v [n, Hkv, D]``: the projections, with a family's
        biases and per-head q/k norms (before RoPE, which :meth:`_attention` applies)."""
        c, b = self.config, self.backend
        n, q_out, kv_out = h.shape[0], c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim
        if layer.wqkv is not None:  # Phi-3: one matrix, [q; k; v] rows
            qkv = b.matmul(h, layer.wqkv)
            q, k, v = qkv[:, :q_out], qkv[:, q_out:q_out + kv_out], qkv[:, q_out + kv_out:]
        else:
            q, k, v = b.matmul_many(h, [layer.wq, layer.wk, layer.wv])
        if layer.bq is not None:  # Qwen2
            q, k, v = q + layer.bq, k + layer.bk, v + layer.bv
        q = q.reshape(n, c.n_heads, c.head_dim)
        k = k.reshape(n, c.n_kv_heads, c.head_dim)
        v = v.reshape(n, c.n_kv_heads, c.head_dim)
        if layer.q_norm is not None:  # Qwen3, Gemma 3: RMSNorm over each head's D
            q = b.rms_norm(q.reshape(-1, c.head_dim), layer.q_norm, c.rms_norm_eps).reshape(q.shape)
            k = b.rms_norm(k.reshape(-1, c.head_dim), layer.k_norm, c.rms_norm_eps).reshape(k.shape)
        return q, k, v

    def _gated(self, h: Any, layer: LayerWeights) -> Any:
        """The MLP's gated activation of ``h [n, d]`` -> ``[n, ff]``: SwiGLU, or Gemma's GeGLU."""
        b = self.backend
        if layer.w_gate_up is not None:  # Phi-3: one matrix, [gate; up] rows
            both = b.matmul(h, layer.w_gate_up)
            gate, up = both[:, :self.config.intermediate_size], both[:, self.config.intermediate_size:]
        else:
            gate, up = b.matmul_many(h, [layer.w_gate, layer.w_up])
        return b.geglu(gate, up) if self.family.activation == "gelu_tanh" else b.swiglu(gate, up)

    def _rotate(self, x: Any, positions: np.ndarray, rotary: Rotary, ends: np.ndarray | None = None) -> Any:
        """RoPE of ``x [n, H, D]`` at ``positions [n]`` by the layer's ``rotary``: chapter 3's
        ``rope`` for a plain one; else its frequencies on its first ``dims`` dimensions (the
        rest pass through), times its ``mscale``. Longrope: rows whose sequence is longer than
        ``rotary.original`` after the step (``ends [n]``) take the long factors, as transformers
        chooses them."""
        b = self.backend
        if rotary.plain and rotary.dims == x.shape[-1]:
            return b.rope(x, positions, rotary.theta)
        part = x[..., :rotary.dims]
        y = b.rope_frequencies(part, positions, rotary.freqs)
        if rotary.long is not None and ends is not None and bool((ends > rotary.original).any()):
            longer = b.xp.asarray((ends > rotary.original)[:, None, None])
            y = b.xp.where(longer, b.rope_frequencies(part, positions, rotary.long.freqs), y)
        if rotary.mscale != 1.0:
            y = y * np.float32(rotary.mscale)
        return y if rotary.dims == x.shape[-1] else b.xp.concatenate([y, x[..., rotary.dims:]], axis=-1)

    def _attention(self, i: int, layer: LayerWeights, q: Any, k: Any, v: Any, step: StepBatch) -> Any:
        """Layer ``i``'s attention for every sequence of the step: RoPE, the cache write, and
        attention over each sequence's cached keys -> ``[n, Hq * D]`` in the step's row order."""
        c, b = self.config, self.backend
        # Llama's attention is called as chapter 3 writes it, (q, k, v); a family's options follow
        options = () if layer.attn.plain else (layer.attn,)
        # RoPE for every token of every sequence in one call: positions are per token
        q = self._rotate(q, step.positions, layer.rotary, step.ends)
        k_rot = k if all(step.unrotated) else self._rotate(k, step.positions, layer.rotary, step.ends)
        outs: list = [None] * len(step.caches)
        if step.together:
            rows = step.rows  # each such sequence's one row of the step
            step.pool.write_decode(i, step.slots, k_rot[rows], v[rows])
            attended = b.paged_decode_attention(q[rows], step.pool.k[i], step.pool.v[i], step.slots.tables,
                                                step.slots.lengths, *options)
            attended = attended.reshape(len(step.together), c.n_heads * c.head_dim)
            if not step.apart:  # a decode step: the rows are already in the step's order
                return attended
            for row, j in enumerate(step.together):
                outs[j] = attended[row:row + 1]
        for j in step.apart:
            cache, t, lo, hi = step.caches[j], step.sizes[j], step.bounds[j], step.bounds[j + 1]
            cache.write(i, (k if step.unrotated[j] else k_rot)[lo:hi], v[lo:hi])
            keys, values = cache.view(i, t)
            if step.unrotated[j]:
                keys = self._rotate(keys, cache.key_positions(t), layer.rotary)
            outs[j] = b.attention(q[lo:hi], keys, values, *options).reshape(t, c.n_heads * c.head_dim)
        return b.xp.concatenate(outs) if len(outs) > 1 else outs[0]

    def _head(self, x: np.ndarray) -> np.ndarray:
        """Final norm and output head: ``x [R, d]`` -> logits ``[R, vocab rows]``; Gemma soft-caps them."""
        b, c = self.backend, self.config
        logits = b.matmul(b.rms_norm(x, self.output_norm, c.rms_norm_eps), self.output)
        if c.final_softcap:
            cap = np.float32(c.final_softcap)
            logits = cap * b.xp.tanh(logits / cap)
        return logits

    def _check_finite(self, logits: Any) -> None:
        """One cheap check per step: a NaN must never become token 0 or an empty answer."""
        if not bool(self.backend.xp.isfinite(logits).all()):
            raise NonFiniteError(
                f"the forward pass produced non-finite logits (NaN or infinity). Valid weights cannot: "
                f"the weights in {self.source_path} are probably damaged or mislabelled (a tensor stored "
                "in one ggml type but labelled another)"
            )
