"""GGML tensor types: the storage formats a GGUF tensor can have.

Introduced in chapter 1 (to count bytes on disk) and taught in depth in
chapter 6 (quantisation). Each type stores ``block_size`` consecutive
elements of a row in ``type_size`` bytes, so a row of ``n`` elements takes
``n // block_size * type_size`` bytes. Numbers follow ggml's ``ggml.h`` /
``ggml.c`` type traits.

This module is the bottom of the stack (the GGUF reader and ``config``
import it) and so depends on nothing else in the engine. It lives in
``quant/``, not ``formats/``, so that ``config`` needs no file format (and
``config`` and ``formats`` do not import each other). The functions that
decode and encode each type live in :mod:`llmrs_core.quant.registry`, keyed
by the same enum.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class GGMLType(enum.IntEnum):
    """Numeric ids of ggml tensor types, as stored in a GGUF tensor info.

    Every id of ``enum ggml_type`` in ``ggml.h`` (llama.cpp as vendored in
    llama-cpp-python 0.3.36), so that any GGUF file can be opened and listed
    even where the engine cannot compute with its types
    (``quant.registry.check_computable`` says which it can). Ids 4, 5 and
    31-33, 36-38 were removed from ggml and are not valid in a file.
    """

    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q4_1 = 3
    Q5_0 = 6
    Q5_1 = 7
    Q8_0 = 8
    Q8_1 = 9
    Q2_K = 10
    Q3_K = 11
    Q4_K = 12
    Q5_K = 13
    Q6_K = 14
    Q8_K = 15
    IQ2_XXS = 16
    IQ2_XS = 17
    IQ3_XXS = 18
    IQ1_S = 19
    IQ4_NL = 20
    IQ3_S = 21
    IQ2_S = 22
    IQ4_XS = 23
    I8 = 24
    I16 = 25
    I32 = 26
    I64 = 27
    F64 = 28
    IQ1_M = 29
    BF16 = 30
    TQ1_0 = 34
    TQ2_0 = 35
    MXFP4 = 39
    NVFP4 = 40
    Q1_0 = 41
    Q2_0 = 42


@dataclass(frozen=True)
class TypeTraits:
    """How a ggml type packs elements: ``block_size`` elements in ``type_size`` bytes.

    ``dtype`` is the NumPy element dtype (little-endian) of a plain element
    type, whose bytes a NumPy view reads as they are; None for the block
    formats and for BF16 (NumPy has no bfloat16).
    """

    block_size: int
    type_size: int
    dtype: str | None = None


QK_K = 256  # elements in one K-quant super-block

TYPE_TRAITS: dict[GGMLType, TypeTraits] = {
    GGMLType.F32: TypeTraits(1, 4, "<f4"),
    GGMLType.F16: TypeTraits(1, 2, "<f2"),
    GGMLType.BF16: TypeTraits(1, 2),  # no NumPy dtype
    GGMLType.F64: TypeTraits(1, 8, "<f8"),
    GGMLType.I8: TypeTraits(1, 1, "i1"),
    GGMLType.I16: TypeTraits(1, 2, "<i2"),
    GGMLType.I32: TypeTraits(1, 4, "<i4"),
    GGMLType.I64: TypeTraits(1, 8, "<i8"),
    GGMLType.Q4_0: TypeTraits(32, 2 + 16),  # fp16 d, 32 nibbles
    GGMLType.Q4_1: TypeTraits(32, 2 + 2 + 16),  # fp16 d, fp16 m, 32 nibbles
    GGMLType.Q5_0: TypeTraits(32, 2 + 4 + 16),  # fp16 d, 32 high bits, nibbles
    GGMLType.Q5_1: TypeTraits(32, 2 + 2 + 4 + 16),
    GGMLType.Q8_0: TypeTraits(32, 2 + 32),  # fp16 d, 32 int8
    GGMLType.Q8_1: TypeTraits(32, 2 + 2 + 32),  # fp16 d, fp16 s = d * sum(q), 32 int8
    GGMLType.Q2_K: TypeTraits(QK_K, QK_K // 16 + QK_K // 4 + 2 + 2),
    GGMLType.Q3_K: TypeTraits(QK_K, QK_K // 8 + QK_K // 4 + 12 + 2),
    GGMLType.Q4_K: TypeTraits(QK_K, 2 + 2 + 12 + QK_K // 2),
    GGMLType.Q5_K: TypeTraits(QK_K, 2 + 2 + 12 + QK_K // 8 + QK_K // 2),
    GGMLType.Q6_K: TypeTraits(QK_K, QK_K // 2 + QK_K // 4 + QK_K // 16 + 2),
    GGMLType.Q8_K: TypeTraits(QK_K, 4 + QK_K + QK_K // 16 * 2),  # f32 d, 256 int8, 16 int16 sums
    # the i-quants: codebooks ("grids") of 8 or 4 values indexed by the stored bits
    GGMLType.IQ2_XXS: TypeTraits(QK_K, 2 + QK_K // 4),
    GGMLType.IQ2_XS: TypeTraits(QK_K, 2 + QK_K // 4 + QK_K // 32),
    GGMLType.IQ3_XXS: TypeTraits(QK_K, 2 + QK_K // 4 + QK_K // 8),
    GGMLType.IQ1_S: TypeTraits(QK_K, 2 + QK_K // 8 + QK_K // 16),
    GGMLType.IQ4_NL: TypeTraits(32, 2 + 16),  # fp16 d, 32 nibbles indexing a 16-value table
    GGMLType.IQ3_S: TypeTraits(QK_K, 2 + QK_K // 4 + QK_K // 8 + QK_K // 32 + 4),
    GGMLType.IQ2_S: TypeTraits(QK_K, 2 + QK_K // 4 + QK_K // 16),
    GGMLType.IQ4_XS: TypeTraits(QK_K, 2 + 2 + QK_K // 64 + QK_K // 2),  # d, scales_h, scales_l, nibbles
    GGMLType.IQ1_M: TypeTraits(QK_K, QK_K // 8 + QK_K // 16 + QK_K // 32),
    # ternary and 4-bit-float formats
    GGMLType.TQ1_0: TypeTraits(QK_K, 2 + 4 * 13),
    GGMLType.TQ2_0: TypeTraits(QK_K, 2 + 64),
    GGMLType.MXFP4: TypeTraits(32, 1 + 16),  # E8M0 scale, 32 FP4 (E2M1) codes
    GGMLType.NVFP4: TypeTraits(64, 4 + 32),  # four E4M3 scales, 64 FP4 codes
    GGMLType.Q1_0: TypeTraits(128, 2 + 16),
    GGMLType.Q2_0: TypeTraits(64, 2 + 16),
}


def type_traits(type_id: int) -> TypeTraits:
    """Traits of a ggml type id; ``ValueError`` naming the id if it is unknown."""
    try:
        return TYPE_TRAITS[GGMLType(type_id)]
    except ValueError:
        known = ", ".join(f"{t.name}={t.value}" for t in TYPE_TRAITS)
        raise ValueError(f"unknown ggml tensor type id {type_id} (known: {known})") from None


def type_by_name(name: str) -> GGMLType:
    """``"q4_1"`` or ``"Q4_1"`` -> ``GGMLType.Q4_1``; ``ValueError`` listing the names if unknown."""
    try:
        return GGMLType[name.upper()]
    except KeyError:
        known = ", ".join(t.name.lower() for t in TYPE_TRAITS)
        raise ValueError(f"unknown weight format {name!r}; choose one of: {known}") from None


def tensor_nbytes(type_id: int, n_elements: int, row_length: int) -> int:
    """Bytes taken by a tensor of ``n_elements`` whose rows are ``row_length`` long.

    Raises ``ValueError`` if the row length is not a multiple of the block size
    (such a tensor cannot be stored in that type).
    """
    traits = type_traits(type_id)
    if row_length % traits.block_size:
        raise ValueError(
            f"row length {row_length} is not a multiple of the {GGMLType(type_id).name} "
            f"block size {traits.block_size}"
        )
    return n_elements // traits.block_size * traits.type_size
