"""Writing a model in another weight format: ``llmrs quantize IN OUT --type q4_k`` (chapter 6).

Every 2-D weight matrix is dequantised to float32 and quantised to the
target type; 1-D tensors (the norms) stay F32, as llama.cpp keeps them.
A matrix whose rows do not split into whole blocks of the target type
(SmolLM2's 576-wide rows and the 256-weight K-quant super-blocks) falls
back to Q8_0. llama.cpp falls back too, but to a closer legacy type (Q5_0
for Q4_K), which this engine does not implement: our ``--type q4_k`` files
are larger than llama.cpp's.
All metadata is copied with its stored types; ``general.file_type`` is set
to the llama.cpp file type of the target.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from .dequant import dequantize_tensor
from .ggml_blocks import quantize
from .types import GGMLType, type_by_name, type_traits

TARGETS = ("f32", "f16", "q8_0", "q4_0", "q4_1", "q4_k", "q6_k")
# llama.cpp's llama_ftype values ("mostly" this type)
FILE_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q8_0": 7, "q4_k": 15, "q6_k": 18}
FALLBACK = GGMLType.Q8_0


def target_type_for(shape: tuple[int, ...], target: GGMLType) -> GGMLType:
    """The type a tensor of ``shape`` gets: F32 for vectors, else ``target`` or the fallback."""
    if len(shape) < 2:
        return GGMLType.F32
    if shape[-1] % type_traits(target).block_size:
        return FALLBACK
    return target


def requantize_gguf(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    target: str,
    progress: Callable[[str, GGMLType], None] | None = None,
) -> dict[str, int]:
    """Write ``src`` to ``dst`` with its matrices in ``target``; returns ``{type name: tensor count}``."""
    if target.lower() not in TARGETS:
        raise ValueError(f"unsupported target type {target!r}; choose one of {', '.join(TARGETS)}")
    gtype = type_by_name(target)
    if Path(src).resolve() == Path(dst).resolve():
        raise ValueError("the output must be a different file from the input")
    # here, not at the top: formats/ imports quant/ (the type table), so quant/ imports formats/ only
    # inside this command, and the two packages form no import cycle
    from ..formats.gguf import GGUFField, GGUFValueType, read_gguf
    from ..formats.gguf_writer import TensorToWrite, write_gguf

    counts: dict[str, int] = {}
    with read_gguf(src) as g:
        metadata = dict(g.fields)
        metadata["general.file_type"] = GGUFField(FILE_TYPES[target.lower()], GGUFValueType.UINT32)
        tensors = []
        for name, info in g.tensors.items():
            t = target_type_for(info.shape, gtype)
            values = dequantize_tensor(g, name)
            tensors.append((name, TensorToWrite(info.shape, t, quantize(values, t).tobytes())))
            counts[t.name] = counts.get(t.name, 0) + 1
            if progress is not None:
                progress(name, t)
        write_gguf(dst, metadata, tensors)
    return counts
