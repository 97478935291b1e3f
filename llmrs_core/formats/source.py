"""The weight-source interface: what the model, the loader and the backends read (chapters 4 and 10).

A model's weights can come from a GGUF file (:class:`~llmrs_core.formats.gguf.GGUFFile`),
a Hugging Face directory (:class:`~llmrs_core.formats.hf.HFWeights`) or, for a
distributed run (chapter 11), a shard of either. The engine reads them all
through this one interface, so that it never asks *which* kind it was handed:

    source.path          where it came from (for messages)
    source.config        the architecture (:class:`~llmrs_core.config.ModelConfig`)
    source.metadata      key -> value (GGUF metadata; a directory gives its name)
    source.file_size     bytes on disk
    source.tensors       GGUF-style name -> info with ``shape`` (NumPy order),
                         ``type_name``, ``n_bytes`` and ``n_elements``
    source.rope_layout   "interleaved" (GGUF, llama.cpp) or "half" (Hugging Face
                         order): which dimensions RoPE pairs for these W_q/W_k rows
    source.float32(name) the tensor as a float32 array of its shape
    source.blocks(name)  ``(stored bytes, GGMLType)`` for a tensor stored in a ggml
                         type, or ``None``: backends that compute from the quantised
                         blocks (chapter 8) use it, others call ``float32``
    source.tokenizer()   the tokenizer the source carries, or ``None`` (tiny test models)
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

if TYPE_CHECKING:
    from ..config import ModelConfig
    from ..quant.types import GGMLType
    from ..tokenizer import Tokenizer

RopeLayout = str  # "interleaved" or "half"
ROPE_LAYOUTS = ("interleaved", "half")


class TensorInfo(Protocol):
    """What the engine knows of a tensor before reading it."""

    @property
    def shape(self) -> tuple[int, ...]: ...

    @property
    def type_name(self) -> str: ...

    @property
    def n_bytes(self) -> int: ...

    @property
    def n_elements(self) -> int: ...


class WeightSource(ABC):
    """Where a model's tensors come from; see the module docstring for the members."""

    path: Path
    metadata: Mapping[str, Any]
    file_size: int
    tensors: Mapping[str, TensorInfo]
    #: which dimensions RoPE pairs for this source's W_q/W_k row order
    rope_layout: RopeLayout = "interleaved"

    @property
    @abstractmethod
    def config(self) -> ModelConfig:
        """The model's architecture."""

    @abstractmethod
    def float32(self, name: str) -> np.ndarray:
        """Tensor ``name`` as float32 of its NumPy shape; ``KeyError`` naming it if absent."""

    def blocks(self, name: str) -> tuple[np.ndarray, GGMLType] | None:
        """The stored bytes of ``name`` (``uint8``, no copy) and its ggml type, or ``None``
        when this source does not store ggml blocks (a safetensors directory)."""
        return None

    def release_pages(self) -> None:
        """Tell the OS that the file's pages read so far need not stay in this process's memory
        (the backend has made its own copies). Arrays handed out stay valid: a page read again
        comes back from the file. A source that maps no file does nothing."""
        return None

    @abstractmethod
    def tokenizer(self) -> Tokenizer | None:
        """A new :class:`~llmrs_core.tokenizer.Tokenizer` from the source's own files or
        metadata; ``None`` if it has none (a malformed one raises ``ValueError``)."""


__all__ = ["ROPE_LAYOUTS", "TensorInfo", "WeightSource"]
