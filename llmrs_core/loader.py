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
from pathlib import Path

from .config import ModelConfig
from .fetch import default_model_path, fetch_model
from .formats.gguf import GGUFFile, read_gguf
from .tokenizer import Tokenizer

BACKENDS = ("numpy",)


class Model:
    """A loaded model file and what the engine knows about it.

    Attributes:
        path: the GGUF file.
        gguf: the parsed file (metadata, tensor infos, memory-mapped data).
        config: the architecture, from the GGUF metadata.
        backend: name of the compute backend (``"numpy"`` until chapter 8).
    """

    def __init__(self, gguf: GGUFFile, backend: str = "numpy"):
        self.gguf = gguf
        self.path = gguf.path
        self.config = ModelConfig.from_gguf(gguf)
        self.backend = backend

    @functools.cached_property
    def tokenizer(self) -> Tokenizer:
        """The model's tokenizer, built from the GGUF's ``tokenizer.*`` metadata (chapter 2)."""
        return Tokenizer.from_gguf(self.gguf)

    @property
    def name(self) -> str:
        return str(self.gguf.metadata.get("general.name", self.path.stem))

    def file_bytes(self) -> int:
        """Size of the model file on disk."""
        return self.gguf.file_size

    def tensor_types(self) -> dict[str, int]:
        """How many tensors are stored in each ggml type, e.g. ``{"Q4_1": 210, ...}``."""
        return dict(Counter(t.ggml_type.name for t in self.gguf.tensors.values()).most_common())

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


def load(path: str | os.PathLike[str] | None = None, backend: str = "numpy") -> Model:
    """Load a model: SmolLM2-135M-Instruct by default (fetched if missing), or a GGUF ``path``.

    Raises ``FileNotFoundError`` for a missing path, ``GGUFError`` (a ``ValueError``)
    for a malformed file and ``ValueError`` for an unknown backend.
    """
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; available: {', '.join(BACKENDS)}")
    if path is None:
        path = default_model_path()
        if not path.exists():
            path = fetch_model()
    path = Path(path)
    if path.is_dir():
        raise ValueError(
            f"{path} is a directory; loading Hugging Face safetensors directories arrives "
            "in chapter 10 — pass a .gguf file for now"
        )
    return Model(read_gguf(path), backend=backend)
