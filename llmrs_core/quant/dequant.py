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

:func:`split_blocks`, :func:`fp16_field` and :func:`unpack_nibbles` read
these layouts (also for ``ggml_blocks.matvec``); :func:`q4_0_affine`,
:func:`q4_1_affine` and :func:`q8_0_symmetric` give the codes and scales in
the two forms the Numba kernels read (``kernels/cpu/packing.py``).
:func:`dequantize` finds each type's decoder in :mod:`.registry`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..formats.ggml_types import GGMLType, type_traits

if TYPE_CHECKING:
    from ..formats.gguf import GGUFFile


def split_blocks(raw: np.ndarray, ggml_type: GGMLType) -> np.ndarray:
    """Stored bytes (any shape) -> uint8 ``[n_blocks, type_size]``, one row per block.

    ``ValueError`` if the bytes are not a whole number of ``ggml_type`` blocks.
    """
    traits = type_traits(ggml_type)
    raw = np.ascontiguousarray(raw, dtype=np.uint8).reshape(-1)
    if raw.size % traits.type_size:
        raise ValueError(f"{raw.size} bytes is not a whole number of {ggml_type.name} blocks ({traits.type_size} bytes)")
    return raw.reshape(-1, traits.type_size)


def fp16_field(blocks: np.ndarray, start: int) -> np.ndarray:
    """uint8 ``[n_blocks, type_size]`` -> the fp16 at byte ``start`` of every block, as float32 ``[n_blocks, 1]``."""
    return blocks[:, start : start + 2].copy().view("<f2").astype(np.float32)


def unpack_nibbles(qs: np.ndarray) -> np.ndarray:
    """uint8 ``[n, 16]`` packed bytes -> uint8 ``[n, 32]`` codes 0..15: the low nibbles first, then the high."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=1)


def dequantize_q8_0(raw: np.ndarray) -> np.ndarray:
    b = split_blocks(raw, GGMLType.Q8_0)
    return (fp16_field(b, 0) * b[:, 2:].view(np.int8).astype(np.float32)).reshape(-1)


def dequantize_q4_0(raw: np.ndarray) -> np.ndarray:
    b = split_blocks(raw, GGMLType.Q4_0)
    q = unpack_nibbles(b[:, 2:]).astype(np.int8) - np.int8(8)
    return (fp16_field(b, 0) * q.astype(np.float32)).reshape(-1)


def dequantize_q4_1(raw: np.ndarray) -> np.ndarray:
    b = split_blocks(raw, GGMLType.Q4_1)
    q = unpack_nibbles(b[:, 4:]).astype(np.float32)
    return (fp16_field(b, 0) * q + fp16_field(b, 2)).reshape(-1)


# -- the blocks as the kernels read them (chapter 8) --------------------------
# The same two forms as kquants.q4_k_affine and kquants.q6_k_symmetric.


def q4_0_affine(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q4_0 bytes as ``w = d * q + m``: codes uint8 ``[n_blocks, 32]``, ``d`` and ``m = -8 d`` float32 ``[n_blocks]``."""
    b = split_blocks(raw, GGMLType.Q4_0)
    d = fp16_field(b, 0)[:, 0]
    return unpack_nibbles(b[:, 2:]), d, np.float32(-8) * d


def q4_1_affine(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q4_1 bytes as ``w = d * q + m``: codes uint8 ``[n_blocks, 32]``, ``d``, ``m`` float32 ``[n_blocks]``."""
    b = split_blocks(raw, GGMLType.Q4_1)
    return unpack_nibbles(b[:, 4:]), fp16_field(b, 0)[:, 0], fp16_field(b, 2)[:, 0]


def q8_0_symmetric(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q8_0 bytes as ``w = d * q``: codes int8 ``[n_blocks, 32]`` (a view), ``d`` float32 ``[n_blocks]``."""
    b = split_blocks(raw, GGMLType.Q8_0)
    return b[:, 2:].view(np.int8), fp16_field(b, 0)[:, 0]


def dequantize(raw: np.ndarray, ggml_type: GGMLType | int, shape: tuple[int, ...]) -> np.ndarray:
    """Stored bytes of a tensor -> float32 array of NumPy ``shape``.

    Supports F32, F16, F64, BF16, Q8_0, Q4_0, Q4_1 and the K-quants Q4_K and
    Q6_K (chapter 6), as :mod:`~llmrs_core.quant.registry` lists them;
    anything else raises ``NotImplementedError`` naming the type and the
    supported ones.
    """
    from .registry import dequantizer  # here, not at the top: the registry imports this module

    ggml_type = GGMLType(ggml_type)
    out = dequantizer(ggml_type)(np.asarray(raw, dtype=np.uint8))
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
