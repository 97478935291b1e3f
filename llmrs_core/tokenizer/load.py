"""``load_tokenizer``: the tokenizer of any model file, without its weights (chapter 2).

A GGUF file's tokenizer is all metadata, so only the header is parsed (a
vocab-only GGUF such as llama.cpp's ``ggml-vocab-*.gguf`` works, and a model
file's tensors are never read); a Hugging Face directory's is ``tokenizer.json``
with ``tokenizer_config.json``.
"""

from __future__ import annotations

import os
from pathlib import Path

from .hf import from_hf_dir
from .tokenizer import Tokenizer


def load_tokenizer(path: str | os.PathLike[str]) -> Tokenizer:
    """The :class:`Tokenizer` of a GGUF file or a Hugging Face directory.

    ``FileNotFoundError`` if ``path`` does not exist; ``ValueError`` naming the file if it
    holds no tokenizer, or one of a kind or pre-tokeniser we do not support.
    """
    from ..formats.gguf import read_gguf

    p = Path(path)
    if p.is_dir():
        return from_hf_dir(p)
    if not p.exists():
        raise FileNotFoundError(f"{p} does not exist (expected a GGUF file or a Hugging Face directory)")
    with read_gguf(p) as g:
        if "tokenizer.ggml.model" not in g.metadata:
            raise ValueError(f"{p}: this GGUF file holds no tokenizer (no tokenizer.ggml.model)")
        return Tokenizer.from_gguf(g)
