"""Chapter 6 — Quantization for Memory and Speed: your exercises.

Exercise 6.6  Implementing INT4 Quantization  (ch06_quantization.ipynb, section 6.6)
Exercise 6.7  Parsing GGUF Files              (ch06_quantization.ipynb, section 6.7)

Check your work with ``make test-chapter 6`` (or ``make test-exercise E=6.6``).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from llmrs_core.quant.integer import Granularity, QuantizedTensor, QuantScheme

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


# -- Exercise 6.6: INT4 quantisation --------------------------------------------------------


def quantize_int(
    x: np.ndarray,
    *,
    bits: int = 8,
    symmetric: bool = True,
    granularity: Granularity = "tensor",
    group_size: int | None = None,
) -> QuantizedTensor:
    """Quantise ``x`` to ``bits``-bit integer codes (bits = 8 or 4). Return
    ``QuantizedTensor(codes, scales, zero_points, QuantScheme(bits, symmetric, granularity, group_size))``.

    Ranges: symmetric int8 [-127, 127], int4 [-7, 7]; asymmetric int8 [-128, 127], int4 [0, 15].
    * symmetric: ``scale = max|x| / qmax``, ``q = rint(x / scale)``, ``zero_points = None``;
    * asymmetric: widen ``[min, max]`` to include 0, ``scale = (max - min) / (qmax - qmin)``,
      ``zero_point = rint(qmin - min / scale)``, ``q = rint(x / scale) + zero_point``;
    clip codes to the range. One scale per ``granularity``: ``"tensor"`` (shape ``()``),
    ``"channel"`` (per row of ``[out, in]``: shape ``[out]``), ``"group"`` (per
    ``group_size`` consecutive values along the last axis: ``[..., n // group_size]``).
    A block of zeros gets scale 0 and zero codes (no NaN). Codes have ``x``'s shape,
    dtype int8 (uint8 for asymmetric int4); scales are float32. Non-finite input or a
    group size that does not divide the last axis raises ``ValueError``.

    Compute the scales in float64 and store them as float32. The exact scale lies between two
    float32 values: the engine takes the one above (so that ``max|x| / scale`` never passes
    ``qmax``), ``.astype(np.float32)`` the nearest. Either is right, and the notebook and the
    tests accept scales one float32 step (ulp) from the engine's, and a code one apart where
    ``x / scale`` is exactly half-way between two codes (a tie) — see ``integer.disagreement``.
    """
    raise NotImplementedError(
        "Exercise 6.6 `quantize_int`: not implemented yet — see ch06_quantization.ipynb §6.6"
    )


def pack_int4(codes: np.ndarray) -> np.ndarray:
    """Two 4-bit codes per byte along the last axis: element 2i in the low nibble,
    2i + 1 in the high nibble; signed codes as two's complement (``& 0x0F``).
    ``[..., n]`` -> ``[..., n // 2]`` uint8. Odd ``n`` or codes out of range: ``ValueError``."""
    raise NotImplementedError(
        "Exercise 6.6 `pack_int4`: not implemented yet — see ch06_quantization.ipynb §6.6"
    )


def unpack_int4(packed: np.ndarray, *, signed: bool) -> np.ndarray:
    """Inverse of :func:`pack_int4`: int8 codes in [-8, 7] if ``signed``, else uint8 in [0, 15]."""
    raise NotImplementedError(
        "Exercise 6.6 `unpack_int4`: not implemented yet — see ch06_quantization.ipynb §6.6"
    )


def quantize_q4_0(x: np.ndarray) -> np.ndarray:
    """GGML Q4_0 blocks of float32 ``x [..., n]`` (n a multiple of 32) -> uint8 ``[..., n / 32 * 18]``.

    Per block of 32: ``m`` = the value of largest magnitude, with its sign; ``d = m / -8``
    (float32); ``q = min(15, trunc(x * id + 8.5))`` with ``id = 1 / d`` in float32, as ggml
    multiplies (dividing by ``d`` rounds differently), and ``id = 0`` where ``d == 0``: a block
    of zeros gets code 8 everywhere (bytes 0x88), as in ggml. Store ``d`` as fp16 (2 bytes)
    then 16 bytes: byte j = ``q[j] | q[j + 16] << 4``.
    """
    raise NotImplementedError(
        "Exercise 6.6 `quantize_q4_0`: not implemented yet — see ch06_quantization.ipynb §6.6"
    )


def quantize_q4_1(x: np.ndarray) -> np.ndarray:
    """GGML Q4_1 blocks: per 32 values ``d = (max - min) / 15``, ``m = min``,
    ``q = min(15, trunc((x - min) * id + 0.5))`` with ``id = 1 / d`` in float32 (0 where
    ``d == 0``), as in Q4_0; bytes: fp16 d, fp16 m, 16 bytes of nibbles as in Q4_0.
    ``[..., n]`` -> ``[..., n / 32 * 20]``."""
    raise NotImplementedError(
        "Exercise 6.6 `quantize_q4_1`: not implemented yet — see ch06_quantization.ipynb §6.6"
    )


def dequantize_q4_0(raw: np.ndarray) -> np.ndarray:
    """Q4_0 bytes (a multiple of 18) -> float32 values, flat: ``w = d * (q - 8)``."""
    raise NotImplementedError(
        "Exercise 6.6 `dequantize_q4_0`: not implemented yet — see ch06_quantization.ipynb §6.6"
    )


def dequantize_q4_1(raw: np.ndarray) -> np.ndarray:
    """Q4_1 bytes (a multiple of 20) -> float32 values, flat: ``w = d * q + m``."""
    raise NotImplementedError(
        "Exercise 6.6 `dequantize_q4_1`: not implemented yet — see ch06_quantization.ipynb §6.6"
    )


# -- Exercise 6.7: parsing GGUF -------------------------------------------------------------


def read_header(data: bytes) -> tuple[int, int, int]:
    """``(version, tensor_count, metadata_kv_count)`` from the first 24 bytes.

    Layout: magic ``b"GGUF"``, version u32, tensor count u64, kv count u64, little-endian
    (``struct.unpack_from("<IQQ", data, 4)``). A wrong magic, fewer than 24 bytes or a
    version other than 2 or 3 raises ``ValueError``.
    """
    raise NotImplementedError(
        "Exercise 6.7 `read_header`: not implemented yet — see ch06_quantization.ipynb §6.7"
    )


def read_string(data: bytes, offset: int) -> tuple[str, int]:
    """A GGUF string at ``offset``: u64 length, then that many UTF-8 bytes.
    Return the string and the offset just after it. A length running past
    the end of ``data`` raises ``ValueError`` naming the offset."""
    raise NotImplementedError(
        "Exercise 6.7 `read_string`: not implemented yet — see ch06_quantization.ipynb §6.7"
    )


def read_value(data: bytes, offset: int, value_type: int) -> tuple[Any, int]:
    """A metadata value of type ``value_type`` at ``offset`` -> ``(value, next offset)``.

    Types: 0 u8, 1 i8, 2 u16, 3 i16, 4 u32, 5 i32, 6 f32, 7 bool, 8 string, 9 array,
    10 u64, 11 i64, 12 f64. An array is: element type u32, count u64, then the
    elements (arrays may nest); return a list. Unknown types, and counts that
    cannot fit in the bytes left, raise ``ValueError``.
    """
    raise NotImplementedError(
        "Exercise 6.7 `read_value`: not implemented yet — see ch06_quantization.ipynb §6.7"
    )


def parse_gguf(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Parse a GGUF file's header, metadata and tensor infos (not the tensor data).

    Returns ``{"version": int, "metadata": {key: value}, "tensors": {name: {"shape": tuple
    (NumPy order: the file lists dimensions fastest first, so reverse them), "type": int
    (ggml type id), "offset": int (relative to the data section)}}, "alignment": int,
    "data_offset": int}``. After the kv pairs come the tensor infos (name string, n_dims u32,
    dims u64 x n_dims, type u32, offset u64); the data section starts at the next multiple of
    ``general.alignment`` (default 32).
    """
    raise NotImplementedError(
        "Exercise 6.7 `parse_gguf`: not implemented yet — see ch06_quantization.ipynb §6.7"
    )
