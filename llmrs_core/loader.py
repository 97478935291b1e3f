"""The front door: ``llmrs_core.load()`` returns a :class:`Model` (introduced in chapter 1).

Chapter 1 gives the model its file and its :class:`~llmrs_core.config.ModelConfig`,
chapter 2 its tokenizer; later chapters add the forward pass and generation (4),
and other backends (8, 9). The names here are the stable public API that
tests, notebooks and the ``llmrs`` CLI all use.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .backends import BACKENDS, DEFAULT_BACKEND, get_backend
from .config import ModelConfig
from .fetch import default_model_path, fetch_model
from .formats.gguf import GGUFFile, read_gguf
from .formats.hf import HFWeights
from .generate import Completion, generate_ids
from .model import LlamaModel
from .sampling import SamplingParams
from .tokenizer import Tokenizer


class Model:
    """A loaded model file and what the engine knows about it.

    Attributes:
        path: the GGUF file.
        gguf: the parsed file (metadata, tensor infos, memory-mapped data).
        config: the architecture, from the GGUF metadata.
        backend: name of the compute backend: ``"numba"`` (the default, chapter 8),
            ``"numpy"`` (the readable reference, chapter 4) or ``"learner"`` (your
            exercise code where it exists; chapters 3-4).
    """

    def __init__(self, gguf: GGUFFile | HFWeights, backend: str | None = None, threads: int | None = None):
        self.gguf = gguf  # the weight source: a GGUF file, or a Hugging Face directory (chapter 10)
        self.path = gguf.path
        self.config = gguf.config if isinstance(gguf, HFWeights) else ModelConfig.from_gguf(gguf)
        self.backend = DEFAULT_BACKEND if backend is None else backend
        self._backend = get_backend(self.backend, threads)

    @functools.cached_property
    def network(self) -> LlamaModel:
        """The weights on the backend, loaded on first use (chapter 4)."""
        return LlamaModel(self.gguf, self.config, self._backend)

    def backend_report(self) -> str:
        """Which implementation each operation uses (the learner backend says whose)."""
        return self._backend.describe()

    # -- the forward pass and generation (chapter 4) -----------------------

    def logits(self, ids: Sequence[int]) -> np.ndarray:
        """Logits ``[T, vocab]`` float32 of a whole sequence, from position 0 (no cache reuse)."""
        return self.network.forward(ids)

    def generate(
        self,
        prompt: str | Sequence[int] | list[str | Sequence[int]],
        max_tokens: int = 128,
        temperature: float = 0.0,
        top_p: float = 1.0,
        top_k: int = 0,
        min_p: float = 0.0,
        repetition_penalty: float = 1.0,
        presence_penalty: float = 0.0,
        frequency_penalty: float = 0.0,
        seed: int | None = None,
        stop: Sequence[str] = (),
        on_text: Callable[[str], None] | None = None,
    ) -> Completion | list[Completion]:
        """Generate a continuation of ``prompt`` (text, or token ids).

        A list of prompts returns a list of completions, in order, computed
        together by the continuous-batching engine (chapter 7); each prompt
        gets its own sampler, seeded with ``seed``. Greedy by default; see
        :mod:`llmrs_core.sampling` for the sampling chain.
        """
        batched = isinstance(prompt, list) and bool(prompt) and not isinstance(prompt[0], (int, np.integer))
        params = SamplingParams(
            temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
            repetition_penalty=repetition_penalty, presence_penalty=presence_penalty,
            frequency_penalty=frequency_penalty, seed=seed,
        )
        if batched:
            return self._generate_batch(prompt, max_tokens, params, stop)
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else [int(i) for i in prompt]
        return generate_ids(
            self.network, self.tokenizer, ids, max_tokens=max_tokens, sampling=params, stop=stop,
            stop_token_ids=self._end_of_turn_ids(), on_text=on_text,
            sampler=self._backend.sampler(params),
        )

    def _generate_batch(
        self, prompts: list, max_tokens: int, params: SamplingParams, stop: Sequence[str]
    ) -> list[Completion]:
        """Run the prompts together through the continuous-batching engine (chapter 7)."""
        from .engine import Engine

        encoded = [self.tokenizer.encode(p) if isinstance(p, str) else [int(i) for i in p] for p in prompts]
        block_size = 16
        needed = sum(-(-(len(ids) + max_tokens) // block_size) for ids in encoded)
        engine = Engine(self.network, self.tokenizer, num_blocks=min(max(needed, 1), 4096), block_size=block_size)
        return engine.generate(encoded, max_tokens, params, stop, stop_token_ids=self._end_of_turn_ids())

    def chat(self, messages: Sequence[Mapping[str, Any]], **kwargs: Any) -> Completion:
        """Render ``messages`` with the model's chat template and generate the assistant's reply."""
        prompt = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        return self.generate(prompt, **kwargs)

    def _end_of_turn_ids(self) -> list[int]:
        ids = [self.tokenizer.eos_token_id] if self.tokenizer.eos_token_id is not None else []
        for text in ("<|im_end|>", "<|endoftext|>", "<|eot_id|>"):
            if text in self.tokenizer.special_tokens:
                ids.append(self.tokenizer.special_tokens[text])
        return ids

    @functools.cached_property
    def tokenizer(self) -> Tokenizer:
        """The model's tokenizer, built from the GGUF's ``tokenizer.*`` metadata (chapter 2)
        or a Hugging Face directory's ``tokenizer.json``."""
        if isinstance(self.gguf, HFWeights):
            return Tokenizer.from_hf_dir(self.path)
        return Tokenizer.from_gguf(self.gguf)

    @property
    def name(self) -> str:
        return str(self.gguf.metadata.get("general.name", self.path.stem))

    def file_bytes(self) -> int:
        """Size of the model file on disk."""
        return self.gguf.file_size

    def tensor_types(self) -> dict[str, int]:
        """How many tensors are stored in each ggml type, e.g. ``{"Q4_1": 210, ...}``."""
        return dict(Counter(t.type_name for t in self.gguf.tensors.values()).most_common())

    def stored_params(self) -> int:
        """Parameters actually stored in the file (sum over its tensor shapes)."""
        return sum(t.n_elements for t in self.gguf.tensors.values())

    def summary(self, context_length: int | None = None) -> dict:
        """Everything ``llmrs info`` prints, as a JSON-ready dict.

        KV-cache figures are for f16 K/V at ``context_length`` tokens
        (default: the model's trained context length).
        """
        cfg = self.config
        ctx = cfg.context_length if context_length is None else context_length
        return {
            "name": self.name,
            "path": str(self.path),
            "architecture": cfg.architecture,
            "config": dataclasses.asdict(cfg),
            "params": {**cfg.param_counts(), "total": cfg.n_params},
            "stored_params": self.stored_params(),
            "file_bytes": self.file_bytes(),
            "tensor_bytes": sum(t.n_bytes for t in self.gguf.tensors.values()),
            "tensor_types": self.tensor_types(),
            "weight_bytes_by_format": {
                fmt: cfg.weight_bytes(fmt) for fmt in ("f32", "f16", "q8_0", "q4_1", "q4_0")
            },
            "kv_cache": {
                "dtype": "f16",
                "bytes_per_token": cfg.kv_bytes_per_token("f16"),
                "context_length": ctx,
                "bytes_for_context": cfg.kv_cache_bytes(ctx, "f16"),
            },
            "flops_per_token": {
                "context_0": cfg.flops_per_token(0),
                f"context_{ctx}": cfg.flops_per_token(ctx),
            },
        }

    def __repr__(self) -> str:
        return f"Model({self.name!r}, {self.config.n_params:,} params, backend={self.backend!r})"


def load(path: str | os.PathLike[str] | None = None, backend: str | None = None,
         threads: int | None = None) -> Model:
    """Load a model: SmolLM2-135M-Instruct by default (fetched if missing), a GGUF file,
    or a Hugging Face directory (``config.json`` + ``model.safetensors``, chapter 10).

    ``backend``: ``"numba"`` (default: quantised weights, fused kernels),
    ``"numpy"`` (the float32 reference the early chapters read) or
    ``"learner"``; ``threads``: the Numba backend's threads (default: all).

    Raises ``FileNotFoundError`` for a missing path, ``GGUFError`` (a ``ValueError``)
    for a malformed file and ``ValueError`` for an unknown backend.
    """
    if backend is not None and backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; available: {', '.join(BACKENDS)}")
    if path is None:
        path = default_model_path()
        if not path.exists():
            path = fetch_model()
    path = Path(path)
    if path.is_dir():
        return Model(HFWeights(path), backend=backend, threads=threads)
    return Model(read_gguf(path), backend=backend, threads=threads)
