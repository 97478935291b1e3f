"""Chapter 6 solutions.

Quantisation is engine code (llmrs_core.quant). The GGUF-parsing functions
are the engine reader's pieces (llmrs_core.formats.gguf) exposed one at a time.
"""

from __future__ import annotations

import os
import struct
from typing import Any

import numpy as np

from llmrs_core.formats.gguf import GGUF_MAGIC, ByteCursor, GGUFValueType, read_gguf
from llmrs_core.formats.gguf import read_value as _read_value
from llmrs_core.quant.dequant import dequantize_q4_0 as _dequantize_q4_0
from llmrs_core.quant.dequant import dequantize_q4_1 as _dequantize_q4_1
from llmrs_core.quant.ggml_blocks import quantize_q4_0, quantize_q4_1
from llmrs_core.quant.integer import QuantizedTensor, QuantScheme, pack_int4, unpack_int4
from llmrs_core.quant.integer import quantize as quantize_int

__all__ = [
    "QuantScheme",
    "QuantizedTensor",
    "dequantize_q4_0",
    "dequantize_q4_1",
    "pack_int4",
    "parse_gguf",
    "quantize_int",
    "quantize_q4_0",
    "quantize_q4_1",
    "read_header",
    "read_string",
    "read_value",
    "unpack_int4",
]


def dequantize_q4_0(raw: np.ndarray) -> np.ndarray:
    return _dequantize_q4_0(raw)


def dequantize_q4_1(raw: np.ndarray) -> np.ndarray:
    return _dequantize_q4_1(raw)


def read_header(data: bytes) -> tuple[int, int, int]:
    if len(data) < 24:
        raise ValueError(f"a GGUF header takes 24 bytes, got {len(data)}")
    if data[:4] != GGUF_MAGIC:
        raise ValueError(f"not a GGUF file: magic is {bytes(data[:4])!r}")
    version, n_tensors, n_kv = struct.unpack_from("<IQQ", data, 4)
    if version not in (2, 3):
        raise ValueError(f"unsupported GGUF version {version}")
    return version, n_tensors, n_kv


def _cursor(data: bytes, offset: int) -> ByteCursor:
    cur = ByteCursor(memoryview(data), "<bytes>")
    cur.pos = offset
    return cur


def read_string(data: bytes, offset: int) -> tuple[str, int]:
    cur = _cursor(data, offset)
    return cur.string("string"), cur.pos


def read_value(data: bytes, offset: int, value_type: int) -> tuple[Any, int]:
    cur = _cursor(data, offset)
    try:
        vtype = GGUFValueType(value_type)
    except ValueError:
        raise ValueError(f"unknown metadata value type {value_type} (at byte offset {offset})") from None
    return _read_value(cur, vtype, "value").value, cur.pos


def parse_gguf(path: str | os.PathLike[str]) -> dict[str, Any]:
    with read_gguf(path) as g:
        return {
            "version": g.version,
            "metadata": dict(g.metadata),
            "tensors": {
                name: {"shape": t.shape, "type": int(t.ggml_type), "offset": t.offset} for name, t in g.tensors.items()
            },
            "alignment": g.alignment,
            "data_offset": g.data_offset,
        }

