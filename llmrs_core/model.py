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
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from .backends.base import Backend
from .config import ModelConfig
from .distributed.plan import SingleProcess, StepPlan
from .formats.source import WeightSource
from .kv_cache.base import KVCache
from .kv_cache.checks import checked_advance, checked_positions, checked_view
from .kv_cache.paged import PagedKVCache, decode_group, reserve_decode, write_decode


@dataclass
class LayerWeights:
    """One decoder block's weights, as prepared by the backend."""

    attn_norm: np.ndarray
    wq: Any
    wk: Any
    wv: Any
    wo: Any
    ffn_norm: np.ndarray
    w_gate: Any
    w_up: Any
    w_down: Any


def check_tensors(gguf: WeightSource, c: ModelConfig, vocab_rows: int | None = None) -> None:
    """Every tensor the forward pass reads exists with the shape the config ``c`` implies, and
    the source has no tensor the model would ignore (a wrong block count, another architecture).
    ``vocab_rows``: rows of the embedding table and output head, when a tensor-parallel shard
    holds only part of the vocabulary (chapter 11); default ``c.vocab_size``."""
    d, q_out, kv_out = c.hidden_size, c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim
    v = c.vocab_size if vocab_rows is None else vocab_rows
    want = {"token_embd.weight": (v, d), "output_norm.weight": (d,)}
    if not c.tie_embeddings:
        want["output.weight"] = (v, d)
    for i in range(c.n_layers):
        p = f"blk.{i}."
        want |= {
            p + "attn_norm.weight": (d,),
            p + "attn_q.weight": (q_out, d),
            p + "attn_k.weight": (kv_out, d),
            p + "attn_v.weight": (kv_out, d),
            p + "attn_output.weight": (d, q_out),
            p + "ffn_norm.weight": (d,),
            p + "ffn_gate.weight": (c.intermediate_size, d),
            p + "ffn_up.weight": (c.intermediate_size, d),
            p + "ffn_down.weight": (d, c.intermediate_size),
        }
    # a tied checkpoint may still store its output matrix (Hugging Face's lm_head): unused, harmless
    extra = sorted(set(gguf.tensors) - set(want) - ({"output.weight"} if c.tie_embeddings else set()))
    if extra:
        layers = sorted({int(n.split(".")[1]) for n in extra if n.startswith("blk.") and n.split(".")[1].isdigit()})
        hint = (
            f"; the block count is {c.n_layers}, but the file has tensors of layer {layers[-1]}: "
            "is the block count right?" if layers and layers[-1] >= c.n_layers else ""
        )
        shown = ", ".join(extra[:4]) + (f" and {len(extra) - 4} more" if len(extra) > 4 else "")
        raise ValueError(f"{gguf.path}: tensors the model does not use: {shown}{hint}")
    for name, shape in want.items():
        if name not in gguf.tensors:
            raise ValueError(f"{gguf.path}: the model needs tensor {name!r}, which the file lacks")
        if gguf.tensors[name].shape != shape:
            raise ValueError(
                f"{gguf.path}: tensor {name!r} has shape {gguf.tensors[name].shape}, "
                f"the config implies {shape}"
            )


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
    """

    def __init__(self, source: WeightSource, config: ModelConfig, backend: Backend,
                 plan: StepPlan | None = None, vocab_rows: int | None = None):
        self.config = config
        self.backend = backend
        self.plan = SingleProcess() if plan is None else plan
        self.source_path = source.path  # for messages that blame the weights
        check_tensors(source, config, vocab_rows)
        backend.prepare(source)
        b, gguf = backend, source
        self.token_embd = b.load_matrix(gguf, "token_embd.weight")
        self.layers = [self._load_layer(gguf, i) for i in range(config.n_layers)]
        self.output_norm = b.load_vector(gguf, "output_norm.weight")
        self.output = self.token_embd if config.tie_embeddings else b.load_matrix(gguf, "output.weight")

    def _load_layer(self, gguf: WeightSource, i: int) -> LayerWeights:
        b, p = self.backend, f"blk.{i}."
        # Q/K/V and gate/up multiply the same input: loaded together, a backend may fuse them
        wq, wk, wv = b.load_matrices(gguf, [p + "attn_q.weight", p + "attn_k.weight", p + "attn_v.weight"])
        w_gate, w_up = b.load_matrices(gguf, [p + "ffn_gate.weight", p + "ffn_up.weight"])
        return LayerWeights(
            attn_norm=b.load_vector(gguf, p + "attn_norm.weight"),
            wq=wq, wk=wk, wv=wv,
            wo=b.load_matrix(gguf, p + "attn_output.weight"),
            ffn_norm=b.load_vector(gguf, p + "ffn_norm.weight"),
            w_gate=w_gate, w_up=w_up,
            w_down=b.load_matrix(gguf, p + "ffn_down.weight"),
        )

    def new_cache(self, max_tokens: int) -> KVCache:
        """A contiguous cache for ``max_tokens`` positions, in the backend's array module: the
        backend's ``engine_parts().kv_cache`` (the engine's ``ContiguousKVCache``, or the
        learner backend's Exercise 5.6 cache where it is written)."""
        return self.backend.engine_parts().kv_cache(self.config, max_tokens, xp=self.backend.xp)

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
        c, b = self.config, self.backend
        all_ids = [np.asarray(ids, dtype=np.int64).reshape(-1) for ids, _ in batch]
        for ids in all_ids:
            if ids.size == 0:
                raise ValueError("forward() needs at least one token id")
            if ids.min() < 0 or ids.max() >= c.vocab_size:
                bad = ids[(ids < 0) | (ids >= c.vocab_size)][0]
                raise ValueError(f"token id {bad} is outside the vocabulary (0..{c.vocab_size - 1})")
        caches = [cache for _, cache in batch]
        sizes = [ids.size for ids in all_ids]
        bounds = np.cumsum([0, *sizes])
        # Each cache names its tokens' RoPE positions (attention sinks count within the
        # cache) and says whether it keeps keys unrotated, to be rotated when read.
        # What a cache returns is checked (kv_cache.checks): it may be the learner's.
        all_positions = np.concatenate([checked_positions(cache, t) for cache, t in zip(caches, sizes)])
        lengths = [cache.length for cache in caches]
        unrotated = [cache.stores_unrotated_keys for cache in caches]
        n = int(bounds[-1])
        b.begin_step(n, tuple(sizes))
        # Decode tokens in the engine's own paged pool are written and attended together:
        # one backend call per layer for all of them, not a gather and a call per sequence.
        group = decode_group(caches, sizes)
        together: list[int] = []
        if group is not None:
            pool, together = group
            together = [j for j in together if not unrotated[j]]
            slots = reserve_decode(pool, [caches[j].seq for j in together]) if together else None
            rows = bounds[together]  # each such sequence's one row of the step
        apart = sorted(set(range(len(batch))) - set(together))
        p = self.plan  # the identity in one process; collectives in a distributed one
        x = p.embed(b, self.token_embd, np.concatenate(all_ids))
        for i, layer in enumerate(self.layers):
            h = b.rms_norm(x, layer.attn_norm, c.rms_norm_eps)
            # RoPE for every token of every sequence in one call: positions are per token
            q_all, k_all, v_all = b.matmul_many(h, [layer.wq, layer.wk, layer.wv])
            q_all = b.rope(q_all.reshape(n, c.n_heads, c.head_dim), all_positions, c.rope_theta)
            k_all = k_all.reshape(n, c.n_kv_heads, c.head_dim)
            k_rot = b.rope(k_all, all_positions, c.rope_theta) if not all(unrotated) else k_all
            v_all = v_all.reshape(n, c.n_kv_heads, c.head_dim)
            outs: list = [None] * len(batch)
            if together:
                write_decode(pool, i, slots, k_rot[rows], v_all[rows])
                attended = b.paged_decode_attention(q_all[rows], pool.k[i], pool.v[i], slots.tables, slots.lengths)
                attended = attended.reshape(len(together), c.n_heads * c.head_dim)
                for row, j in enumerate(together):
                    outs[j] = attended[row:row + 1]
            for j in apart:
                cache, t = caches[j], sizes[j]
                lo, hi = bounds[j], bounds[j + 1]
                cache.write(i, (k_all if unrotated[j] else k_rot)[lo:hi], v_all[lo:hi])
                keys, values = checked_view(cache, i, t, lengths[j], k_all.shape[1], k_all.shape[2])
                if unrotated[j]:
                    keys = b.rope(keys, cache.key_positions(t), c.rope_theta)
                outs[j] = b.attention(q_all[lo:hi], keys, values).reshape(t, c.n_heads * c.head_dim)
            if not apart:  # a decode step: the rows are already in the step's order
                attention_out = attended
            else:
                attention_out = b.xp.concatenate(outs) if len(outs) > 1 else outs[0]
            x = x + p.reduce(b.matmul(attention_out, layer.wo))
            h = b.rms_norm(x, layer.ffn_norm, c.rms_norm_eps)
            gate, up = b.matmul_many(h, [layer.w_gate, layer.w_up])
            x = x + p.reduce(b.matmul(b.swiglu(gate, up), layer.w_down))
        logits = p.logits(x, bounds[1:] - 1 if last_only else None, self._head)
        self._check_finite(logits)
        # Only a step that succeeded moves the caches on: after a failure (here or in any
        # operation above) every cache is as it was, and the step can be run again.
        for cache, t, length in zip(caches, sizes, lengths):
            checked_advance(cache, t, length)
        if last_only:
            return [logits[j : j + 1] for j in range(len(batch))]
        return [logits[bounds[j] : bounds[j + 1]] for j in range(len(batch))]

    def _head(self, x: np.ndarray) -> np.ndarray:
        """Final norm and output head: ``x [R, d]`` -> logits ``[R, vocab rows]``."""
        b = self.backend
        return b.matmul(b.rms_norm(x, self.output_norm, self.config.rms_norm_eps), self.output)

    def _check_finite(self, logits: Any) -> None:
        """One cheap check per step: a NaN must never become token 0 or an empty answer."""
        if not bool(self.backend.xp.isfinite(logits).all()):
            raise NonFiniteError(
                f"the forward pass produced non-finite logits (NaN or infinity). Valid weights cannot: "
                f"the weights in {self.source_path} are probably damaged or mislabelled (a tensor stored "
                "in one ggml type but labelled another)"
            )
