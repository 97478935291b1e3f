"""Dequantising GGML block formats with vectorised NumPy (introduced in chapter 4).

Byte layouts, as in ggml (``ggml-common.h``); each block covers 32
consecutive weights of one row:

    Q8_0  34 bytes   d: fp16 | qs: 32 x int8            w = d * q
    Q4_0  18 bytes   d: fp16 | qs: 16 bytes of nibbles  w = d * (q - 8)
    Q4_1  20 bytes   d: fp16 | m: fp16 | qs: 16 bytes   w = d * q + m

In the 4-bit formats byte ``j`` of ``qs`` holds element ``j`` in its low
nibble and element ``j + 16`` in its high nibble. The arithmetic is done in
float32 from the fp16 scales, as ggml's reference dequantisation does, so
the results are bit-exact with ``gguf.quants.dequantize``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..formats.ggml_types import GGMLType, type_traits

if TYPE_CHECKING:
    from ..formats.gguf import GGUFFile


def _blocks(raw: np.ndarray, ggml_type: GGMLType) -> np.ndarray:
    traits = type_traits(ggml_type)
    raw = np.ascontiguousarray(raw, dtype=np.uint8).reshape(-1)
    if raw.size % traits.type_size:
        raise ValueError(f"{raw.size} bytes is not a whole number of {ggml_type.name} blocks ({traits.type_size} bytes)")
    return raw.reshape(-1, traits.type_size)


def _scale(blocks: np.ndarray, start: int) -> np.ndarray:
    """The fp16 at byte ``start`` of every block, as float32 ``[n_blocks, 1]``."""
    return blocks[:, start : start + 2].copy().view("<f2").astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """``[n, 16]`` packed bytes -> ``[n, 32]`` values: low nibbles first, then high."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=1)


def dequantize_q8_0(raw: np.ndarray) -> np.ndarray:
    b = _blocks(raw, GGMLType.Q8_0)
    return (_scale(b, 0) * b[:, 2:].view(np.int8).astype(np.float32)).reshape(-1)


def dequantize_q4_0(raw: np.ndarray) -> np.ndarray:
    b = _blocks(raw, GGMLType.Q4_0)
    q = _nibbles(b[:, 2:]).astype(np.int8) - np.int8(8)
    return (_scale(b, 0) * q.astype(np.float32)).reshape(-1)


def dequantize_q4_1(raw: np.ndarray) -> np.ndarray:
    b = _blocks(raw, GGMLType.Q4_1)
    q = _nibbles(b[:, 4:]).astype(np.float32)
    return (_scale(b, 0) * q + _scale(b, 2)).reshape(-1)


_FLOAT_TYPES = {GGMLType.F32: "<f4", GGMLType.F16: "<f2", GGMLType.F64: "<f8"}
_DEQUANTIZERS = {
    GGMLType.Q8_0: dequantize_q8_0,
    GGMLType.Q4_0: dequantize_q4_0,
    GGMLType.Q4_1: dequantize_q4_1,
}


def dequantize(raw: np.ndarray, ggml_type: GGMLType | int, shape: tuple[int, ...]) -> np.ndarray:
    """Stored bytes of a tensor -> float32 array of NumPy ``shape``.

    Supports F32, F16, F64, BF16, Q8_0, Q4_0, Q4_1 and the K-quants Q4_K and
    Q6_K (chapter 6); anything else raises ``NotImplementedError`` naming the type.
    """
    ggml_type = GGMLType(ggml_type)
    raw = np.asarray(raw, dtype=np.uint8)
    if ggml_type in _FLOAT_TYPES:
        out = raw.view(_FLOAT_TYPES[ggml_type]).astype(np.float32)
    elif ggml_type is GGMLType.BF16:
        out = (raw.view("<u2").astype(np.uint32) << 16).view(np.float32)
    elif ggml_type in _DEQUANTIZERS:
        out = _DEQUANTIZERS[ggml_type](raw)
    elif ggml_type in (GGMLType.Q4_K, GGMLType.Q6_K):
        from . import kquants

        out = kquants.dequantize_q4_k(raw) if ggml_type is GGMLType.Q4_K else kquants.dequantize_q6_k(raw)
    else:
        raise NotImplementedError(f"dequantising {ggml_type.name} is not supported")
    n = int(np.prod(shape))
    if out.size != n:
        raise ValueError(f"{out.size} values decoded, but shape {shape} needs {n}")
    return out.reshape(shape)


def dequantize_tensor(gguf: GGUFFile, name: str) -> np.ndarray:
    """Tensor ``name`` of a GGUF file as a float32 array of its NumPy shape."""
    info = gguf.tensor_info(name)
    return dequantize(gguf.tensor_bytes(name), info.ggml_type, info.shape)


def dequantize_all(gguf: GGUFFile) -> dict[str, np.ndarray]:
    """Every tensor of a GGUF file as float32 arrays, by name (SmolLM2: about 540 MB)."""
    return {name: dequantize_tensor(gguf, name) for name in gguf.tensors}


def load_float32(source, name: str) -> np.ndarray:
    """Weight ``name`` of a model source as float32: a GGUF file (dequantised) or any
    source with a ``float32(name)`` method (a Hugging Face directory, chapter 10)."""
    if hasattr(source, "float32"):
        return source.float32(name)
    return dequantize_tensor(source, name)
