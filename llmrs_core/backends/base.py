"""The backend interface: the operations the model's forward pass is made of.

Shapes: ``x [T, d]``; ``q [T, Hq, D]``, ``k, v [Tk, Hkv, D]``; weights are
whatever :meth:`Backend.load_matrix` returned for that backend (a float32
array for NumPy, packed quantised blocks for the optimised backends).

The model drives a backend in a fixed order, and a backend may rely on it:

1. :meth:`Backend.prepare` once, with the weight source, before any weight
   is loaded (the backend learns the source's RoPE layout here);
2. ``load_*`` for every weight;
3. per forward step, :meth:`Backend.begin_step` with the step's token count,
   then the step's operations.

Activations and KV-cache storage live in the backend's array module
:attr:`Backend.xp` (NumPy for the CPU backends; CuPy for a GPU backend), so
caches allocate through it and the model never assumes NumPy arrays.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np

from ..attention import PLAIN, AttentionOptions
from ..sampling import Sampler, SamplingParams

if TYPE_CHECKING:
    from ..config import ModelConfig
    from ..formats.source import WeightSource
    from ..model import LayerWeights
    from ..step import StepBatch


class DecodeProgram(ABC):
    """A backend's compiled form of the model's layer loop for decode steps (chapter 8)."""

    @abstractmethod
    def run(self, x: Any, step: StepBatch) -> Any | None:
        """``x [n, d]`` (the step's embeddings) through every layer -> ``[n, d]``, each sequence's new
        keys and values written into its cache; None, touching nothing, for a step it does not
        take (the model then runs its loop). The loop's operations, in its order."""


class Backend(ABC):
    """Operations of a Llama forward pass; one subclass per way of computing them."""

    name: str = "abstract"
    #: the array module activations and caches live in (``numpy``, or ``cupy`` on a GPU)
    xp: ModuleType = np
    #: "interleaved" (GGUF, llama.cpp) or "half" (Hugging Face layout): set by :meth:`prepare`
    rope_layout: str = "interleaved"
    #: token counts of one forward step that, run once each, reach every kernel this
    #: backend compiles (``LlamaModel.warm_up``); empty for a backend that compiles nothing
    warm_up_sizes: tuple[int, ...] = ()

    def prepare(self, source: WeightSource) -> None:
        """Called once by the model before it loads any weight of ``source``."""
        from ..formats.source import ROPE_LAYOUTS

        if source.rope_layout not in ROPE_LAYOUTS:
            raise ValueError(f"{source.path}: unknown RoPE layout {source.rope_layout!r} (known: {ROPE_LAYOUTS})")
        self.rope_layout = source.rope_layout

    def to_host(self, x: Any) -> np.ndarray:
        """``x`` (an array of :attr:`xp`) as a NumPy array in host memory; a GPU backend copies."""
        return np.asarray(x)

    def begin_step(self, n_tokens: int, sizes: tuple[int, ...] = ()) -> None:
        """Called by the model at the start of every forward step of ``n_tokens`` tokens
        (all sequences of a batch together; ``sizes``: each sequence's share, in the order
        of the step's rows). A backend may choose the step's kernels here."""
        return None

    @abstractmethod
    def load_matrix(self, source: WeightSource, name: str) -> Any:
        """Prepare weight matrix ``name`` ``[out, in]`` for :meth:`matmul` and :meth:`embed`."""

    def load_matrices(self, source: WeightSource, names: list[str]) -> list[Any]:
        """Several matrices that always multiply the same input (Q, K and V; gate and up).

        A backend may store them as one matrix so that :meth:`matmul_many`
        makes one pass (one kernel launch) instead of several.
        """
        return [self.load_matrix(source, name) for name in names]

    def matmul_many(self, x: np.ndarray, ws: list[Any]) -> list[np.ndarray]:
        """``[x @ W.T for W in ws]`` for matrices loaded together by :meth:`load_matrices`."""
        return [self.matmul(x, w) for w in ws]

    def load_vector(self, source: WeightSource, name: str) -> np.ndarray:
        """A 1-D float32 weight (norm scales)."""
        return np.ascontiguousarray(source.float32(name), dtype=np.float32)

    @abstractmethod
    def embed(self, table: Any, ids: np.ndarray) -> np.ndarray:
        """Rows ``ids`` of the embedding table -> ``[T, d]`` float32."""

    @abstractmethod
    def matmul(self, x: np.ndarray, w: Any) -> np.ndarray:
        """``x [T, in] @ W.T -> [T, out]``."""

    @abstractmethod
    def rms_norm(self, x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray: ...

    @abstractmethod
    def swiglu(self, gate: np.ndarray, up: np.ndarray) -> np.ndarray: ...

    def geglu(self, gate: np.ndarray, up: np.ndarray) -> np.ndarray:
        """Gemma's gated activation: ``gelu_tanh(gate) * up`` (appendix B)."""
        from .. import layers

        return layers.geglu(gate, up)

    @abstractmethod
    def rope(self, x: np.ndarray, positions: np.ndarray, theta: float) -> np.ndarray:
        """Rotary embedding of ``x [T, H, D]`` in the :attr:`rope_layout` convention."""

    def rope_frequencies(self, x: np.ndarray, positions: np.ndarray, freqs: np.ndarray) -> np.ndarray:
        """Rotary embedding of ``x [T, H, 2 * len(freqs)]`` at the angular frequencies ``freqs``
        (a family's scaled RoPE: :class:`~llmrs_core.rope.Rotary`), in the :attr:`rope_layout`."""
        from ..rope import apply_rope_frequencies

        return apply_rope_frequencies(x, positions, freqs, self.rope_layout)

    @abstractmethod
    def attention(self, q: np.ndarray, k: np.ndarray, v: np.ndarray,
                  options: AttentionOptions = PLAIN) -> np.ndarray:
        """Causal GQA attention; queries are the last ``Tq`` of the ``Tk`` positions. ``options``:
        a family's sliding window, soft-cap and scale (:class:`~llmrs_core.attention.AttentionOptions`)."""

    def paged_decode_attention(self, q: Any, k_pool: Any, v_pool: Any, tables: np.ndarray,
                               lengths: np.ndarray, options: AttentionOptions = PLAIN) -> Any:
        """One decode token of each of ``n`` sequences stored in one layer's block pool:
        ``q [n, Hq, D]``, ``k_pool, v_pool [num_blocks, Hkv, block_size, D]``, ``tables``
        int64 ``[n, max blocks]`` (sequence ``i``'s position ``p`` is slot ``p % block_size`` of
        block ``tables[i, p // block_size]``) and ``lengths`` ``[n]`` (positions attended, the
        new token's included) -> ``[n, Hq, D]``.

        This default gathers each sequence's keys and values and calls :meth:`attention` per
        sequence; a backend with a kernel that reads the pool in place overrides it.
        """
        block_size = k_pool.shape[2]
        outs = []
        for i in range(q.shape[0]):
            positions = np.arange(int(lengths[i]))
            blocks, offsets = tables[i][positions // block_size], positions % block_size
            outs.append(self.attention(q[i:i + 1], k_pool[blocks, :, offsets], v_pool[blocks, :, offsets], options))
        return self.xp.concatenate(outs) if len(outs) > 1 else outs[0]

    def decode_program(self, layers: list[LayerWeights], config: ModelConfig) -> DecodeProgram | None:
        """Called once by the model after loading ``layers``: a compiled layer loop for its decode
        steps, or None (this default): the model's own loop runs every step."""
        return None

    def sampler(self, params: SamplingParams) -> Callable[..., int]:
        """The token chooser for ``params`` (``sampler(logits, history) -> id``)."""
        return Sampler(params)

    def describe(self) -> str:
        return self.name
