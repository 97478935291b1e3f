"""Chapter 10 — Model Formats and Serialization: your exercises.

Exercise 10.6  Building a Model Loader  (ch10_model_formats.ipynb, section 10.6)
Exercise 10.7  GGUF Parser              (ch10_model_formats.ipynb, section 10.7)

Check your work with ``make test-chapter 10`` (or ``make test-exercise E=10.6``).

Weights are NumPy arrays in NumPy order ([out_features, in_features]);
"GGUF names" are llama.cpp's (``blk.3.attn_q.weight``), which the engine uses.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from llmrs_core.formats.gguf import GGUFField
from llmrs_core.formats.gguf_writer import TensorToWrite

__all__ = [
    "GGUFField",
    "TensorToWrite",
    "gguf_tensors_as_arrays",
    "hf_to_gguf_name",
    "load_hf_weights",
    "load_safetensors",
    "read_safetensors_header",
    "write_gguf",
]


# -- Exercise 10.6: a model loader ----------------------------------------------------


def read_safetensors_header(path: str | os.PathLike[str]) -> tuple[dict, int]:
    """``(header, data_offset)`` of a safetensors file.

    The file starts with ``N`` (u64, little-endian), then ``N`` bytes of UTF-8
    JSON: ``{"name": {"dtype": "F32", "shape": [...], "data_offsets": [b, e]}, ...}``
    with an optional ``"__metadata__"`` entry; the data starts at ``8 + N``.
    Return the parsed JSON (``__metadata__`` included) and ``8 + N``. A header
    length beyond the file, or a header that is not a JSON object, raises ``ValueError``.
    """
    raise NotImplementedError(
        "Exercise 10.6 `read_safetensors_header`: not implemented yet — see ch10_model_formats.ipynb §10.6"
    )


def load_safetensors(path: str | os.PathLike[str]) -> dict[str, np.ndarray]:
    """Every tensor of a safetensors file as a NumPy array of its shape.

    Offsets are relative to the data section. Dtypes: F32/F16/F64/I64/I32/I16/I8/U8/BOOL
    map to NumPy little-endian dtypes; BF16 (no NumPy dtype) comes back as float32:
    its 16 bits are the top half of a float32. Check that each tensor's byte range
    matches dtype x shape and lies inside the file (``ValueError`` otherwise).
    """
    raise NotImplementedError(
        "Exercise 10.6 `load_safetensors`: not implemented yet — see ch10_model_formats.ipynb §10.6"
    )


def hf_to_gguf_name(name: str) -> str | None:
    """Hugging Face tensor name -> GGUF name, or None for a tensor the engine does not use.

    ``model.embed_tokens.weight`` -> ``token_embd.weight``; ``model.norm.weight`` ->
    ``output_norm.weight``; ``lm_head.weight`` -> ``output.weight``; and for layer i:
    ``input_layernorm`` -> ``attn_norm``, ``self_attn.{q,k,v,o}_proj`` ->
    ``attn_{q,k,v,output}``, ``post_attention_layernorm`` -> ``ffn_norm``,
    ``mlp.{gate,up,down}_proj`` -> ``ffn_{gate,up,down}`` (``model.layers.i.`` -> ``blk.i.``).
    """
    raise NotImplementedError(
        "Exercise 10.6 `hf_to_gguf_name`: not implemented yet — see ch10_model_formats.ipynb §10.6"
    )


def load_hf_weights(directory: str | os.PathLike[str], permute_qk: bool = True) -> dict[str, np.ndarray]:
    """A Hugging Face Llama directory's weights as float32 arrays under GGUF names.

    Read ``config.json`` (``num_attention_heads``, ``num_key_value_heads``) and
    ``model.safetensors``; rename with :func:`hf_to_gguf_name` (skip None). With
    ``permute_qk``, reorder the rows of every W_q and W_k for interleaved RoPE:
    within each head of D rows, row i of the first half goes to 2i and row i of
    the second half to 2i + 1 (Exercise 3.7's ``permute_for_interleaved``).
    """
    raise NotImplementedError(
        "Exercise 10.6 `load_hf_weights`: not implemented yet — see ch10_model_formats.ipynb §10.6"
    )


# -- Exercise 10.7: GGUF, tensors and all -------------------------------------------------


def gguf_tensors_as_arrays(path: str | os.PathLike[str]) -> dict[str, np.ndarray]:
    """Every tensor of a GGUF file, dequantised to float32, in NumPy shape.

    Parse the file (your chapter 6 parser, or ``llmrs_core.formats.gguf.read_gguf``)
    and decode each tensor's bytes by its type: F32, F16, Q8_0, Q4_0, Q4_1 at least
    (``llmrs_core.quant.dequantize`` shows the block layouts).
    """
    raise NotImplementedError(
        "Exercise 10.7 `gguf_tensors_as_arrays`: not implemented yet — see ch10_model_formats.ipynb §10.7"
    )


def write_gguf(
    path: str | os.PathLike[str],
    metadata: Mapping[str, Any | GGUFField],
    tensors: Mapping[str, np.ndarray | TensorToWrite] | Iterable[tuple[str, np.ndarray | TensorToWrite]],
    *,
    version: int = 3,
) -> None:
    """Write a GGUF file: header, metadata, tensor infos, padding to the alignment, data.

    ``metadata`` values are Python values (int -> UINT32, or INT32/INT64 when negative
    or large; float -> FLOAT32; bool; str; lists -> ARRAY) or ``GGUFField`` with an
    explicit type. Tensors are float32/float16 arrays or ``TensorToWrite`` (raw bytes of
    any ggml type). Each tensor's data starts at a multiple of ``general.alignment``
    (default 32) from the data section; pad with zeros. A file read with ``read_gguf``
    and written back with its ``fields`` and raw tensors must be byte-identical.
    """
    raise NotImplementedError(
        "Exercise 10.7 `write_gguf`: not implemented yet — see ch10_model_formats.ipynb §10.7"
    )
