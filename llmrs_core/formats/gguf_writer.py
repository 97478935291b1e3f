"""GGUF writer (chapter 10): metadata and tensors in, one GGUF file out; the reader is :mod:`.gguf`.

The layout written is the one :mod:`.gguf` reads (its docstring draws it):
header, metadata (each value with its stored type), tensor infos, zero
padding to ``general.alignment`` (default 32), then each tensor's bytes
padded to the alignment. A read file's ``fields`` written back give the
same bytes, because each :class:`~.gguf.GGUFField` keeps its stored type.
As gguf-py keeps ``gguf_writer.py`` beside ``gguf_reader.py``.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..files import atomic_write
from ..quant.types import GGMLType, tensor_nbytes
from .gguf import DEFAULT_ALIGNMENT, GGUF_MAGIC, NUMPY_DTYPES, SCALAR_FORMATS, GGUFField, GGUFValueType


def _infer_type(value: Any) -> GGUFValueType:
    if isinstance(value, bool):
        return GGUFValueType.BOOL
    if isinstance(value, (int, np.integer)):
        if 0 <= value < 2**32:
            return GGUFValueType.UINT32
        if -(2**31) <= value < 2**31:
            return GGUFValueType.INT32
        return GGUFValueType.INT64 if value < 0 else GGUFValueType.UINT64
    if isinstance(value, (float, np.floating)):
        return GGUFValueType.FLOAT32
    if isinstance(value, str):
        return GGUFValueType.STRING
    if isinstance(value, (list, tuple)):
        return GGUFValueType.ARRAY
    raise TypeError(f"cannot store a {type(value).__name__} in GGUF metadata")


def _pack_string(s: str) -> bytes:
    raw = s.encode("utf-8")
    return struct.pack("<Q", len(raw)) + raw


def _pack_value(value: Any, vtype: GGUFValueType, etype: GGUFValueType | None = None) -> bytes:
    if vtype is GGUFValueType.STRING:
        return _pack_string(value)
    if vtype is not GGUFValueType.ARRAY:
        return struct.pack(SCALAR_FORMATS[vtype], value)
    items = list(value)
    if etype is None:
        kinds = {_infer_type(v) for v in items} or {GGUFValueType.UINT32}
        if kinds == {GGUFValueType.UINT32, GGUFValueType.INT32}:
            kinds = {GGUFValueType.INT32}
        if len(kinds) != 1:
            raise TypeError(f"GGUF arrays hold one type; got {sorted(k.name for k in kinds)}")
        (etype,) = kinds
    out = [struct.pack("<IQ", etype, len(items))]
    if etype in NUMPY_DTYPES:
        out.append(np.asarray(items, dtype=NUMPY_DTYPES[etype]).tobytes())
    else:
        out.extend(_pack_value(v, etype) for v in items)
    return b"".join(out)


@dataclass(frozen=True)
class TensorToWrite:
    """A tensor for :func:`write_gguf`: NumPy-order ``shape``, ggml type, raw bytes."""

    shape: tuple[int, ...]
    ggml_type: GGMLType
    data: bytes


def as_tensor_to_write(array: np.ndarray) -> TensorToWrite:
    """Wrap a float32/float16 NumPy array for writing."""
    types = {np.dtype("float32"): GGMLType.F32, np.dtype("float16"): GGMLType.F16}
    if array.dtype not in types:
        raise TypeError(f"write float32 or float16 arrays (got {array.dtype}); quantise first")
    return TensorToWrite(tuple(array.shape), types[array.dtype], np.ascontiguousarray(array).astype(
        array.dtype.newbyteorder("<")).tobytes())


def write_gguf(
    path: str | os.PathLike[str],
    metadata: Mapping[str, Any | GGUFField],
    tensors: Mapping[str, np.ndarray | TensorToWrite] | Iterable[tuple[str, np.ndarray | TensorToWrite]],
    *,
    version: int = 3,
) -> None:
    """Write a GGUF file.

    ``metadata`` values are plain Python values (types inferred: int -> UINT32
    or INT32/64, float -> FLOAT32, list -> ARRAY) or :class:`GGUFField` to fix
    the stored type. ``tensors`` are float arrays or :class:`TensorToWrite`.
    The file is written to a temporary name and renamed, so a failure never
    leaves a half-written file at ``path``.
    """
    alignment = DEFAULT_ALIGNMENT
    if "general.alignment" in metadata:
        a = metadata["general.alignment"]
        alignment = a.value if isinstance(a, GGUFField) else a
    items = list(tensors.items()) if isinstance(tensors, Mapping) else list(tensors)
    prepared = [
        (name, t if isinstance(t, TensorToWrite) else as_tensor_to_write(t)) for name, t in items
    ]

    head = [GGUF_MAGIC, struct.pack("<IQQ", version, len(prepared), len(metadata))]
    for key, value in metadata.items():
        field = value if isinstance(value, GGUFField) else GGUFField(value, _infer_type(value))
        head.append(_pack_string(key))
        head.append(struct.pack("<I", field.type))
        head.append(_pack_value(field.value, field.type, field.element_type))
    offset = 0
    for name, t in prepared:
        ne = list(reversed(t.shape))
        expected = tensor_nbytes(t.ggml_type, int(np.prod(t.shape)), ne[0])
        if len(t.data) != expected:
            raise ValueError(
                f"tensor {name!r}: {len(t.data)} bytes given, {t.ggml_type.name} {t.shape} needs {expected}"
            )
        head.append(_pack_string(name))
        head.append(struct.pack(f"<I{len(ne)}QIQ", len(ne), *ne, t.ggml_type, offset))
        offset += -(-len(t.data) // alignment) * alignment

    with atomic_write(path) as f:
        header = b"".join(head)
        f.write(header)
        f.write(b"\0" * (-len(header) % alignment))
        for _, t in prepared:
            f.write(t.data)
            f.write(b"\0" * (-len(t.data) % alignment))
