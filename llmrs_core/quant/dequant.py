"""Dequantising GGML block formats with vectorised NumPy (introduced in chapter 4).

Byte layouts, as in ggml (``ggml-common.h``); each block covers 32
consecutive weights of one row:

    Q8_0  34 bytes   d: fp16 | qs: 32 x int8            w = d * q
    Q4_0  18 bytes   d: fp16 | qs: 16 bytes of nibbles  w = d * (q - 8)
    Q4_1  20 bytes   d: fp16 | m: fp16 | qs: 16 bytes   w = d * q + m
    Q5_0  22 bytes   d: fp16 | qh: 4 bytes | qs: 16     w = d * (q - 16)
    Q5_1  24 bytes   d: fp16 | m: fp16 | qh: 4 | qs: 16 w = d * q + m
    IQ4_NL 18 bytes  d: fp16 | qs: 16 bytes             w = d * IQ4_VALUES[q]

In the 4-bit formats byte ``j`` of ``qs`` holds element ``j`` in its low
nibble and element ``j + 16`` in its high nibble. The 5-bit formats add the
fifth bit of element ``j`` as bit ``j`` of ``qh`` (a little-endian uint32).
IQ4_NL's codes index a fixed table of 16 int8 values spaced closer near zero
(``kvalues_iq4nl``), where most weights lie. The arithmetic is done in
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

from .types import GGMLType, type_traits

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


def unpack_five_bits(qh: np.ndarray, qs: np.ndarray) -> np.ndarray:
    """``qh`` uint8 ``[n, 4]``, ``qs`` uint8 ``[n, 16]`` -> codes uint8 ``[n, 32]`` in 0..31."""
    high = np.ascontiguousarray(qh).view("<u4")  # [n, 1]
    bits = ((high >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8)
    return unpack_nibbles(qs) | (bits << 4)


def dequantize_q5_0(raw: np.ndarray) -> np.ndarray:
    q, d = q5_0_symmetric(raw)
    return (d[:, None] * q.astype(np.float32)).reshape(-1)


def dequantize_q5_1(raw: np.ndarray) -> np.ndarray:
    q, d, m = q5_1_affine(raw)
    return (d[:, None] * q.astype(np.float32) + m[:, None]).reshape(-1)


#: IQ4_NL / IQ4_XS's 16 levels (ggml-common.h ``kvalues_iq4nl``): a non-uniform 4-bit grid
IQ4_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], dtype=np.int8)


def dequantize_iq4_nl(raw: np.ndarray) -> np.ndarray:
    q, d = iq4_nl_symmetric(raw)
    return (d[:, None] * q.astype(np.float32)).reshape(-1)


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


def q5_1_affine(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q5_1 bytes as ``w = d * q + m``: codes uint8 ``[n_blocks, 32]`` in 0..31, ``d``, ``m`` float32 ``[n_blocks]``."""
    b = split_blocks(raw, GGMLType.Q5_1)
    return unpack_five_bits(b[:, 4:8], b[:, 8:]).astype(np.uint8), fp16_field(b, 0)[:, 0], fp16_field(b, 2)[:, 0]


def q8_0_symmetric(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q8_0 bytes as ``w = d * q``: codes int8 ``[n_blocks, 32]`` (a view), ``d`` float32 ``[n_blocks]``."""
    b = split_blocks(raw, GGMLType.Q8_0)
    return b[:, 2:].view(np.int8), fp16_field(b, 0)[:, 0]


def q5_0_symmetric(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q5_0 bytes as ``w = d * q``: codes int8 ``[n_blocks, 32]`` (``q - 16``, in -16..15), ``d`` float32
    ``[n_blocks]``: Q8_0's form holds it exactly."""
    b = split_blocks(raw, GGMLType.Q5_0)
    q = unpack_five_bits(b[:, 2:6], b[:, 6:]).astype(np.int8) - np.int8(16)
    return q, fp16_field(b, 0)[:, 0]


def iq4_nl_symmetric(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """IQ4_NL bytes as ``w = d * q``: the table's values int8 ``[n_blocks, 32]``, ``d`` float32 ``[n_blocks]``."""
    b = split_blocks(raw, GGMLType.IQ4_NL)
    return IQ4_VALUES[unpack_nibbles(b[:, 2:])], fp16_field(b, 0)[:, 0]


def dequantize(raw: np.ndarray, ggml_type: GGMLType | int, shape: tuple[int, ...]) -> np.ndarray:
    """Stored bytes of a tensor -> float32 array of NumPy ``shape``.

    Supports the types :mod:`~llmrs_core.quant.registry` lists
    (``supported("dequantize")``);
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
