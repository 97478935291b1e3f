"""Weight matrices repacked for the Numba kernels (chapter 8, section 8.2).

GGUF's blocks put fp16 scales between the codes, in the way of SIMD (chapter 8.1
explains); the kernels read a layout made for them:

* **rows interleaved** in groups of :data:`LANES` (32): byte ``j`` of block
  ``b`` of all 32 rows of a group lies side by side, so one vector load
  brings one code for each of 32 output rows, and each lane of the vector
  accumulates a different row — no horizontal sums, no shuffles;
* **scales separated**, as float32 ``[groups, blocks, LANES]``, converted
  from fp16 once at load instead of on every product.

Every 4-bit type with one scale and one offset per 32 weights fits one form,
``w = d * q + m`` with ``q`` in 0..15: Q4_1 directly, Q4_0 with
``m = -8 d``, and Q4_K with each 32-weight sub-block's ``d * sc`` and
``-dmin * m``. The symmetric types have the other form, ``w = d * q`` with
``q`` int8: Q8_0 with blocks of 32, Q6_K with its 16-weight sub-blocks
(``q - 32``, scale ``d * sc``). Other types fit it exactly too: Q5_0
(``q - 16``, blocks of 32), IQ4_NL and IQ4_XS (the table's int8 value,
scale ``d`` or ``d * (s - 32)`` per 32), Q3_K (``q - 4``, scale
``d * (s - 32)`` per 16). The decoded weight is the same float32 product
``d * q`` as the dequantiser's. Types with an offset per block that is not
4-bit (Q5_1, Q5_K, Q2_K) and the float types (F32, F16, BF16) are kept as a
float32 matrix and multiplied by BLAS; the int8 kernels read the first three from
an unsigned 8-bit copy of their own (:data:`UNSIGNED_FORMS`).

Rows are padded with zero weights to a multiple of :data:`LANES`; the
kernels compute the padding rows and the callers slice them away.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ...quant.dequant import (
    dequantize,
    iq4_nl_symmetric,
    q4_0_affine,
    q4_1_affine,
    q5_0_symmetric,
    q5_1_affine,
    q8_0_symmetric,
)
from ...quant.iq4 import iq4_xs_symmetric
from ...quant.kquants import q4_k_affine, q5_k_affine, q6_k_symmetric
from ...quant.kquants_low import q2_k_affine, q3_k_symmetric
from ...quant.types import GGMLType, type_traits
from .activations import activation_scheme

if TYPE_CHECKING:
    from .int8 import Int8Rows

#: output rows per interleaved group: two AVX-512 (or four AVX2) float32 registers
LANES = 32
#: weights per block of the Q4 form (and of Q8_0; Q6_K's blocks are 16)
BLOCK = 32

#: The types the kernels read, each with its form and the function that splits its stored bytes
#: into that form: ``"q4"`` -> (codes uint8 ``[n_blocks, 32]``, ``d``, ``m`` float32 ``[n_blocks]``),
#: ``"q8"`` -> (codes int8 ``[n_blocks, block]``, ``d`` float32 ``[n_blocks]``). The form is the
#: kernel's choice, not the format's (Q4_0 is symmetric, but read as affine it keeps 4-bit codes),
#: so this table lives here; what every type stores is in ``quant/registry.py``.
KERNEL_FORMS: dict[GGMLType, tuple[str, Callable[[np.ndarray], tuple[np.ndarray, ...]]]] = {
    GGMLType.Q4_0: ("q4", q4_0_affine),
    GGMLType.Q4_1: ("q4", q4_1_affine),
    GGMLType.Q4_K: ("q4", q4_k_affine),
    GGMLType.Q8_0: ("q8", q8_0_symmetric),
    GGMLType.Q6_K: ("q8", q6_k_symmetric),
    GGMLType.Q5_0: ("q8", q5_0_symmetric),
    GGMLType.IQ4_NL: ("q8", iq4_nl_symmetric),
    GGMLType.IQ4_XS: ("q8", iq4_xs_symmetric),
    GGMLType.Q3_K: ("q8", q3_k_symmetric),
}

#: Types with an offset whose codes are wider than 4 bits: no packed form holds them (the float
#: kernels keep them as float32), but the int8 kernels read them as unsigned codes with an offset
#: (``int8.int8_rows_unsigned``): codes uint8 ``[n_blocks, block]``, ``d``, ``m`` float32 ``[n_blocks]``
UNSIGNED_FORMS: dict[GGMLType, Callable[[np.ndarray], tuple[np.ndarray, np.ndarray, np.ndarray]]] = {
    GGMLType.Q5_1: q5_1_affine,
    GGMLType.Q5_K: q5_k_affine,
    GGMLType.Q2_K: q2_k_affine,
}


@dataclass
class PackedMatrix:
    """A weight matrix ``[rows, cols]`` in the layout one kernel family reads.

    ``kind`` is ``"q4"`` (``qs`` uint8 ``[G, nb, 16, LANES]``: byte ``j`` holds
    the codes of weights ``j`` (low nibble) and ``j + 16`` (high nibble) of each
    32-weight block), ``"q8"`` (``qs`` int8 ``[G, nb, bs, LANES]`` for blocks of
    ``bs`` = 32 or 16 weights) or ``"f32"`` (``qs`` is the float32 matrix itself). ``d`` and ``m`` are float32
    ``[G, nb, LANES]`` (``m`` is empty for ``q8`` and ``f32``).
    """

    kind: str
    rows: int
    cols: int
    qs: np.ndarray
    d: np.ndarray
    m: np.ndarray
    source: str
    #: for a part of a fused matrix (see :func:`fuse`): the whole, and this part's first group
    fused: PackedMatrix | None = None
    first_group: int = 0
    #: the row-major copy the int8 decode kernels read (``int8.int8_rows``), when the backend made one
    int8: Int8Rows | None = None
    #: the matrix's bytes as the file stores them (``uint8``, a view of the file where it is one) and
    #: their ggml type, kept by :meth:`keep_int8_only` for reading rows (an embedding)
    stored: tuple[np.ndarray, GGMLType] | None = None
    #: whether the packed arrays were freed (:meth:`keep_int8_only`)
    released: bool = False

    @property
    def nbytes(self) -> int:
        """The bytes this matrix holds: its packed arrays and its int8 copy (not the file's bytes)."""
        own = self.qs.nbytes + self.d.nbytes + self.m.nbytes
        return own + (self.int8.nbytes if self.int8 is not None else 0)

    @property
    def shape(self) -> tuple[int, int]:
        return (self.rows, self.cols)

    def keep_int8_only(self, stored: tuple[np.ndarray, GGMLType] | None) -> None:
        """Free the packed arrays of a matrix the int8 kernels multiply from its copy alone: they
        would double its memory. ``stored`` (the file's bytes) still gives its rows (:meth:`rows_of`);
        None for a matrix whose rows nothing reads (a fused whole). The arrays become empty ones of
        the same dtype and rank, so compiled callers keep their types."""
        if self.int8 is None:
            raise ValueError("keep_int8_only: this matrix has no int8 copy to keep")
        self.qs, self.d, self.m = (np.empty((0,) * a.ndim, a.dtype) for a in (self.qs, self.d, self.m))
        self.stored = stored
        self.released = True

    def rows_of(self, ids: np.ndarray) -> np.ndarray:
        """Rows ``ids`` (int ``[T]``) float32 ``[T, cols]`` dequantised from the stored bytes, as ggml's
        ``get_rows`` does (the values the packed arrays held); for a released matrix."""
        if self.stored is None:
            raise ValueError("rows_of reads the stored bytes, which only a released matrix keeps")
        raw, ggml_type = self.stored
        rows = raw.reshape(self.rows, -1)[ids]
        return dequantize(rows, ggml_type, (ids.size, self.cols))



def _interleave(a: np.ndarray, rows: int) -> np.ndarray:
    """``[rows, nb, ...]`` -> ``[G, nb, ..., LANES]``, padding rows with zeros."""
    groups = -(-rows // LANES)
    padded = np.zeros((groups * LANES, *a.shape[1:]), dtype=a.dtype)
    padded[:rows] = a
    padded = padded.reshape(groups, LANES, *a.shape[1:])
    return np.ascontiguousarray(np.moveaxis(padded, 1, -1))


def pack_affine_q4(codes: np.ndarray, d: np.ndarray, m: np.ndarray, source: str) -> PackedMatrix:
    """Pack ``w = d * codes + m``: codes uint8 ``[rows, cols]`` in 0..15, ``d``, ``m`` ``[rows, cols / 32]``."""
    rows, cols = codes.shape
    nb = cols // BLOCK
    c = codes.reshape(rows, nb, 2, 16).astype(np.uint8)
    packed = c[:, :, 0, :] | (c[:, :, 1, :] << 4)  # [rows, nb, 16]: GGUF's own nibble order
    return PackedMatrix(
        "q4", rows, cols, _interleave(packed, rows),
        _interleave(d.astype(np.float32).reshape(rows, nb), rows),
        _interleave(m.astype(np.float32).reshape(rows, nb), rows), source,
    )


def pack_q8(codes: np.ndarray, d: np.ndarray, source: str, block: int = BLOCK) -> PackedMatrix:
    """Pack ``w = d * codes``: codes int8 ``[rows, cols]``, ``d`` ``[rows, cols / block]``."""
    rows, cols = codes.shape
    nb = cols // block
    return PackedMatrix(
        "q8", rows, cols, _interleave(codes.reshape(rows, nb, block).astype(np.int8), rows),
        # m is unused; an empty 3-D array keeps its type the same as the Q4 form's for compiled callers
        _interleave(d.astype(np.float32).reshape(rows, nb), rows), np.zeros((0, 0, 0), np.float32), source,
    )


def pack_float(w: np.ndarray, source: str) -> PackedMatrix:
    """Keep a float matrix as float32 ``[rows, cols]`` (multiplied by BLAS)."""
    w = np.ascontiguousarray(w, dtype=np.float32)
    empty = np.zeros(0, np.float32)
    return PackedMatrix("f32", w.shape[0], w.shape[1], w, empty, empty, source)


def _check_size(raw: np.ndarray, ggml_type: GGMLType, shape: tuple[int, int]) -> None:
    rows, cols = shape
    traits = type_traits(ggml_type)
    if cols % traits.block_size:
        raise ValueError(f"a {ggml_type.name} row holds whole blocks of {traits.block_size}; got {cols} columns")
    want = rows * cols // traits.block_size * traits.type_size
    if raw.size != want:
        raise ValueError(
            f"a [{rows}, {cols}] {ggml_type.name} matrix is {want} bytes; got {raw.size} (truncated or mislabelled?)"
        )


def pack_raw(raw: np.ndarray, ggml_type: GGMLType, shape: tuple[int, int]) -> PackedMatrix | None:
    """Pack the GGUF bytes of a ``[rows, cols]`` matrix, or None for a type without a kernel (not in
    :data:`KERNEL_FORMS`: the caller keeps it as float32)."""
    rows, cols = shape
    ggml_type = GGMLType(ggml_type)
    if ggml_type not in KERNEL_FORMS:
        return None
    _check_size(raw, ggml_type, shape)
    kind, split = KERNEL_FORMS[ggml_type]
    if kind == "q4":
        codes, d, m = split(raw)
        return pack_affine_q4(codes.reshape(rows, cols), d.reshape(rows, -1), m.reshape(rows, -1), ggml_type.name)
    codes, d = split(raw)
    return pack_q8(codes.reshape(rows, cols), d.reshape(rows, -1), ggml_type.name, block=codes.shape[1])


def unsigned_parts(raw: np.ndarray, ggml_type: GGMLType, shape: tuple[int, int]
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """A :data:`UNSIGNED_FORMS` type's ``[rows, cols]`` matrix as codes uint8 ``[rows, cols]`` and ``d``,
    ``m`` float32 ``[rows, cols / block]``; None for another type."""
    ggml_type = GGMLType(ggml_type)
    if ggml_type not in UNSIGNED_FORMS:
        return None
    _check_size(raw, ggml_type, shape)
    codes, d, m = UNSIGNED_FORMS[ggml_type](raw)
    rows, cols = shape
    return codes.reshape(rows, cols), d.reshape(rows, -1), m.reshape(rows, -1)


def fuse(parts: list[PackedMatrix]) -> list[PackedMatrix] | None:
    """Stack matrices that multiply the same input (Q, K, V) into one; returns views of the parts.

    Each returned part reads its rows of the fused matrix and remembers it
    (``fused``, ``first_group``), so one kernel call can compute all parts.
    None when they cannot be stacked (different kinds or widths, or a part
    whose rows are not a whole number of groups).
    """
    kinds = {p.kind for p in parts}
    if len(kinds) != 1 or kinds <= {"f32"} or len({p.qs.shape[1:] for p in parts}) != 1:
        return None
    if len({activation_scheme(p.source) for p in parts}) != 1:
        return None  # one int8 product quantises its input one way: Q4_K's and Q4_0's differ
    if parts[0].qs.shape[2] != BLOCK and len({p.source for p in parts}) != 1:
        return None  # Q6_K's and Q3_K's int8 copies differ in form (int8.PLANE_FORMS): one type per whole
    if any(p.rows % LANES for p in parts):
        return None
    whole = PackedMatrix(
        parts[0].kind, sum(p.rows for p in parts), parts[0].cols,
        np.concatenate([p.qs for p in parts]), np.concatenate([p.d for p in parts]),
        np.concatenate([p.m for p in parts]) if parts[0].kind == "q4" else parts[0].m,
        "+".join(p.source for p in parts),
    )
    views, g0 = [], 0
    for p in parts:
        g1 = g0 + p.rows // LANES
        m = whole.m[g0:g1] if p.kind == "q4" else whole.m
        views.append(PackedMatrix(p.kind, p.rows, p.cols, whole.qs[g0:g1], whole.d[g0:g1], m, p.source,
                                  fused=whole, first_group=g0))
        g0 = g1
    return views


def fused_whole(parts: list[PackedMatrix]) -> PackedMatrix | None:
    """The matrix :func:`fuse` stacked ``parts`` into, when they are all of it (one product of the whole
    computes every part), else None."""
    whole = parts[0].fused
    if whole is not None and all(p.fused is whole for p in parts) and sum(p.rows for p in parts) == whole.rows:
        return whole
    return None


__all__ = ["BLOCK", "KERNEL_FORMS", "LANES", "UNSIGNED_FORMS", "PackedMatrix", "fuse", "fused_whole", "pack_affine_q4", "pack_float",
           "pack_q8", "pack_raw", "unsigned_parts"]
