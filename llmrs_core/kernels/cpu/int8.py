"""The int8 decode path: activations quantised to 8 bits, integer dot products (chapter 8, "int8").

llama.cpp's CPU decode does not multiply 4-bit weights by float
activations. It quantises ``x`` first, per block of 32 values, as Q8_1
keeps it: a scale ``d_x = max|x| / 127``, int8 codes ``q_x = round(x / d_x)``
(halves away from zero, ggml's ``roundf``) and ``s_x = d_x * sum(q_x)``. Then
per block of weights ``w = d_w q_w + m_w`` (the Q4 form) or ``w = d_w q_w``
(Q8_0)::

    w_b . x_b  ~  d_w d_x (q_w . q_x) + m_w s_x

where ``q_w . q_x`` is a dot product of integers, exact in int32: two AVX2
instructions per 32 weights, or one with AVX-512 VNNI (the intrinsics below). What it costs: each
activation moves by up to half its block's step ``d_x / 2`` (a relative
error of about 1/254 of the block's largest value), which is llama.cpp's
level of agreement, not the float kernels' 1e-6.

The kernels read a copy of each matrix of their own (:class:`Int8Rows`, made
from a :class:`~.packing.PackedMatrix` at load): rows in groups of four, and
within a group block ``b`` of each row before block ``b + 1``, so that one
16-byte load holds a block's 32 codes of one row for the byte products, and
a group is one sequential stream. The interleaved layout the float kernels
read puts 32 *rows* side by side instead, which suits float lanes but not
byte pairs. The copy takes 24 bytes per 32 weights in the Q4 form (16 of
codes, float32 ``d`` and ``m``) and 36 for Q8_0, as much again as the
interleaved layout; decode reads only the copy, prompt processing only the
interleaved one.

:func:`int8_unavailable` is the dispatch: the int8 kernels exist only for
x86-64 targets with AVX2, and are compiled only when it returns None;
:func:`int8_instructions` says which dot product they are compiled with.

Shapes: ``x [T, cols]`` float32; ``xq [T, cols]`` int8, ``xd``, ``xs``
``[T, cols / 32]`` float32; output ``[T, rows]`` float32.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.core.errors import TypingError
from numba.extending import intrinsic

from .inspect import target_declares, target_lacks
from .packing import BLOCK, LANES, PackedMatrix

# --- The intrinsics ----------------------------------------------------------------------------
# They live in this file, not a module of their own, because Numba's on-disk cache of a kernel
# is invalidated by changes to the kernel's own source file only: an edit to an intrinsic in
# another file would leave the cached kernels running the old instructions.
#
# SIMD intrinsics: the integer dot products LLVM's auto-vectoriser does not find.
#
# Auto-vectorisation turns a loop over 4-bit codes times float activations
# into widening moves, conversions to float and ``vfmadd...ps`` (section 8.1).
# llama.cpp multiplies *bytes by bytes* instead, after quantising the
# activations to int8 (Q8_1, quantize_q8_1). On AVX2 that is two
# instructions per 32 weights:
#
# * ``vpmaddubsw`` (``llvm.x86.avx2.pmadd.ub.sw``): 32 unsigned bytes times
#   32 signed bytes, adjacent products added pairwise -> 16 int16;
# * ``vpmaddwd`` (``llvm.x86.avx2.pmadd.wd``) with a vector of ones: adjacent
#   int16 added pairwise -> 8 int32.
#
# AVX-512 VNNI has both steps in one: ``vpdpbusd`` (``llvm.x86.avx512.vpdpbusd.256``)
# adds 4 adjacent unsigned-by-signed byte products into each of 8 int32 lanes,
# the same lanes without an int16 step in between.
#
# No Numba type is a vector register, so each function here is an
# ``@intrinsic`` that writes the LLVM IR of a group of rows' dot products (the
# loop over their blocks included) with llvmlite's IR builder, and stores them.
# Per block ``b`` of 32 weights and row it adds ``d_w[b] d_x[b] * (q_w . q_x)``
# (the integer dot product, exact in int32, converted to float32 exactly)
# into an 8-lane float32 accumulator, and for the affine form the offset term
# ``m_w[b] s_x[b]`` into a scalar; the 8 lanes are added once per row, as a tree.
#
# Integer ranges: a Q4 code is 0..15 and an activation code -127..127, so a
# ``vpmaddubsw`` pair is at most 2 * 15 * 127 = 3810 in magnitude, far from the
# int16 saturation at 32767. Q8 weight codes are signed (-128..127), and
# ``vpmaddubsw`` wants its first operand unsigned: as in llama.cpp, the weights
# go in as ``|w|`` and the activations as ``x * sign(w)`` (``vpsignb``), pairs up
# to 2 * 128 * 127 = 32512, still below 32767. A block's int32 sum is at most
# 32 * 128 * 127 = 520192 < 2**24, so its conversion to float32 is exact.
#
# These functions call x86 instructions unconditionally: compiling them for a
# CPU without them fails inside LLVM (it aborts the process). Only the kernels
# below call them, and the backend calls those only when int8_unavailable()
# says the target Numba compiles for has AVX2; ``vpdpbusd`` is emitted only where
# the target's feature string declares AVX-512 VNNI and VL (int8_instructions()),
# which a bare NUMBA_CPU_NAME does not: such targets get the AVX2 pair.
#
# Array arguments (C-contiguous, :class:`Int8Rows`'s): ``qs`` uint8
# ``[groups, nb * 4 * 16]`` (byte ``j`` of a block: code ``j`` in the low nibble,
# ``j + 16`` in the high one, GGUF's order) or int8 ``[groups, nb * 4 * 32]``;
# ``d``, ``m`` float32 ``[groups, nb * 4]``; ``xq`` int8 ``[T, nb * 32]``; ``xd``,
# ``xs`` float32 ``[T, nb]``; ``out`` float32 ``[T, groups * 4]``; ``group``, ``t`` integers.

_I8, _I16, _I32, _F32 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.FloatType()
_V16I8 = ir.VectorType(_I8, 16)
_V32I8 = ir.VectorType(_I8, 32)
_V16I16 = ir.VectorType(_I16, 16)
_V8I32 = ir.VectorType(_I32, 8)
_V8F = ir.VectorType(_F32, 8)


def _declare(module, name: str, ret, args):
    return cgutils.get_or_insert_function(module, ir.FunctionType(ret, args), name)


def _load(builder, base, index, vector_type):
    """An unaligned load of ``vector_type`` from ``base + index`` (in elements of ``base``)."""
    p = builder.gep(base, [index])
    return builder.load(builder.bitcast(p, vector_type.as_pointer()), align=1)


def _splat8(builder, value):
    v = builder.insert_element(ir.Constant(_V8F, ir.Undefined), value, ir.Constant(_I32, 0))
    return builder.shuffle_vector(v, ir.Constant(_V8F, ir.Undefined), ir.Constant(ir.VectorType(_I32, 8), [0] * 8))


def _hsum(builder, vec, start):
    """``start + sum(vec)``, the 8 lanes added as a tree (halves, then quarters, then pairs): three
    dependent additions instead of eight in a row."""
    for width in (4, 2, 1):
        lanes = ir.VectorType(_F32, width) if width > 1 else None
        low = [ir.Constant(_I32, k) for k in range(width)]
        high = [ir.Constant(_I32, width + k) for k in range(width)]
        if lanes is None:
            vec = builder.fadd(builder.extract_element(vec, low[0]), builder.extract_element(vec, high[0]))
        else:
            undef = ir.Constant(vec.type, ir.Undefined)
            vec = builder.fadd(builder.shuffle_vector(vec, undef, ir.Constant(ir.VectorType(_I32, width), low)),
                               builder.shuffle_vector(vec, undef, ir.Constant(ir.VectorType(_I32, width), high)))
    return builder.fadd(start, vec)


def _rows_dot(context, builder, signature, args, affine: bool, n_rows: int, vnni: bool, n_t: int) -> None:
    """The IR of one group of ``n_rows`` weight rows against ``n_t`` activation rows (``t`` onwards),
    stored into ``out``.

    ``affine``: Q4 codes with an offset, else signed Q8 codes. ``vnni``: one ``vpdpbusd`` per
    block and row instead of ``vpmaddubsw`` + ``vpmaddwd`` (the same int32 lanes: no pair sum
    saturates, see above). The group's blocks lie one after the other in memory (block ``b``
    of its rows 0..n_rows-1, then block ``b + 1``: :class:`Int8Rows`), so a group is one
    sequential stream; each activation block is loaded once for all its rows, each weight
    block unpacked once for all ``n_t`` activation rows, and each (row, activation row) pair
    has its own accumulator, so their fused multiply-adds do not wait on each other.
    """
    n_arrays = 7 if affine else 5
    arrays = [context.make_array(ty)(context, builder, value)
              for ty, value in zip(signature.args[:n_arrays], args[:n_arrays])]
    if affine:
        qs, d, m, xq, xd, xs, out = (a.data for a in arrays)
    else:
        qs, d, xq, xd, out = (a.data for a in arrays)
    per_group = builder.extract_value(arrays[1].shape, 1)  # d is [groups, nb * n_rows]
    nb = builder.udiv(per_group, ir.Constant(per_group.type, n_rows))
    out_cols = builder.extract_value(arrays[-1].shape, 1)  # out is [T, groups * n_rows]
    group = context.cast(builder, args[n_arrays], signature.args[n_arrays], types.intp)
    t = context.cast(builder, args[n_arrays + 1], signature.args[n_arrays + 1], types.intp)
    intp = nb.type
    module = builder.module
    fma = _declare(module, "llvm.fma.v8f32", _V8F, [_V8F, _V8F, _V8F])
    if vnni:
        dpbusd = _declare(module, "llvm.x86.avx512.vpdpbusd.256", _V8I32, [_V8I32, _V8I32, _V8I32])
    else:
        maddubs = _declare(module, "llvm.x86.avx2.pmadd.ub.sw", _V16I16, [_V32I8, _V32I8])
        maddwd = _declare(module, "llvm.x86.avx2.pmadd.wd", _V8I32, [_V16I16, _V16I16])
    sign = None if affine else _declare(module, "llvm.x86.avx2.psign.b", _V32I8, [_V32I8, _V32I8])
    ones = ir.Constant(_V16I16, [1] * 16)

    def int_dot(wv, xv):
        """8 int32 lanes, each the sum of 4 consecutive products of unsigned ``wv`` and signed ``xv`` bytes."""
        if vnni:
            zero = ir.Constant(_V8I32, [0] * 8)
            return builder.call(dpbusd, [zero, builder.bitcast(wv, _V8I32), builder.bitcast(xv, _V8I32)])
        return builder.call(maddwd, [builder.call(maddubs, [wv, xv]), ones])

    tile = [(r, j) for r in range(n_rows) for j in range(n_t)]
    accs = {rj: cgutils.alloca_once_value(builder, ir.Constant(_V8F, [0.0] * 8)) for rj in tile}
    offsets = {rj: cgutils.alloca_once_value(builder, ir.Constant(_F32, 0.0)) for rj in tile}
    with cgutils.for_range(builder, nb) as loop:
        b = loop.index
        x_codes, x_scale, x_sum = [], [], []
        for j in range(n_t):  # activation row t + j's block b
            xb = builder.add(builder.mul(builder.add(t, ir.Constant(intp, j)), nb), b)
            x_codes.append(_load(builder, xq, builder.mul(xb, ir.Constant(intp, 32)), _V32I8))
            x_scale.append(builder.load(builder.gep(xd, [xb])))
            x_sum.append(builder.load(builder.gep(xs, [xb])) if affine else None)
        group_block = builder.mul(builder.add(builder.mul(group, nb), b), ir.Constant(intp, n_rows))
        for r in range(n_rows):
            rb = builder.add(group_block, ir.Constant(intp, r))  # block b of the group's row r
            if affine:  # the codes unpacked once, for every activation row of the tile
                packed = _load(builder, qs, builder.mul(rb, ir.Constant(intp, 16)), _V16I8)
                low = builder.and_(packed, ir.Constant(_V16I8, [15] * 16))
                high = builder.lshr(packed, ir.Constant(_V16I8, [4] * 16))
                wv = builder.shuffle_vector(low, high, ir.Constant(ir.VectorType(_I32, 32), list(range(32))))
                xvs = x_codes
            else:
                codes = _load(builder, qs, builder.mul(rb, ir.Constant(intp, 32)), _V32I8)
                wv = builder.call(sign, [codes, codes])  # |w|, read as unsigned bytes
                xvs = [builder.call(sign, [xc, codes]) for xc in x_codes]  # x * sign(w)
            w_scale = builder.load(builder.gep(d, [rb]))
            w_offset = builder.load(builder.gep(m, [rb])) if affine else None
            for j in range(n_t):
                acc = accs[r, j]
                sums = builder.sitofp(int_dot(wv, xvs[j]), _V8F)
                scale = builder.fmul(w_scale, x_scale[j])
                builder.store(builder.call(fma, [sums, _splat8(builder, scale), builder.load(acc)]), acc)
                if affine:
                    term = builder.fmul(w_offset, x_sum[j])
                    builder.store(builder.fadd(builder.load(offsets[r, j]), term), offsets[r, j])
    first_row = builder.mul(group, ir.Constant(intp, n_rows))
    for r, j in tile:
        total = _hsum(builder, builder.load(accs[r, j]), builder.load(offsets[r, j]))
        at = builder.add(builder.mul(builder.add(t, ir.Constant(intp, j)), out_cols), first_row)
        builder.store(total, builder.gep(out, [builder.add(at, ir.Constant(intp, r))]))


def _check_arrays(*arrays) -> None:
    """The IR indexes raw data pointers: only C-contiguous 2-D arrays are laid out as it assumes."""
    for a in arrays:
        if not (isinstance(a, types.Array) and a.ndim == 2 and a.layout == "C"):
            raise TypingError(f"the int8 row dot products read C-contiguous 2-D arrays; got {a}")


def _rows_intrinsic(affine: bool, n_rows: int, n_t: int):
    """An ``@intrinsic`` storing ``out[t:t + n_t, g * n_rows:(g + 1) * n_rows]``: group ``g`` of the
    weight's rows against rows ``t`` to ``t + n_t - 1`` of the activations. Which instructions it
    emits is decided when a kernel calling it is compiled, for the target Numba compiles for
    (:func:`int8_instructions`)."""
    if affine:
        def typer(typingctx, qs, d, m, xq, xd, xs, out, group, t):
            _check_arrays(qs, d, m, xq, xd, xs, out)
            return types.void(qs, d, m, xq, xd, xs, out, group, t), codegen
    else:
        def typer(typingctx, qs, d, xq, xd, out, group, t):
            _check_arrays(qs, d, xq, xd, out)
            return types.void(qs, d, xq, xd, out, group, t), codegen

    def codegen(context, builder, signature, args):
        _rows_dot(context, builder, signature, args, affine, n_rows, int8_instructions() == "avx512-vnni", n_t)
        return context.get_dummy_value()

    typer.__name__ = f"{'q4' if affine else 'q8'}_rows_dot_{n_rows}x{n_t}"
    return intrinsic(typer)


#: rows of a group (:class:`Int8Rows`), taken together: one activation block loaded for all four
GROUP_ROWS = 4
#: activation rows taken together: each unpacked weight block serves both (8 accumulators in flight)
PAIR = 2
q4_rows_dot = _rows_intrinsic(affine=True, n_rows=GROUP_ROWS, n_t=1)
q4_rows_dot_pair = _rows_intrinsic(affine=True, n_rows=GROUP_ROWS, n_t=PAIR)
q8_rows_dot = _rows_intrinsic(affine=False, n_rows=GROUP_ROWS, n_t=1)
q8_rows_dot_pair = _rows_intrinsic(affine=False, n_rows=GROUP_ROWS, n_t=PAIR)


def int8_unavailable() -> str | None:
    """Why the int8 kernels cannot run here (a reason, for reports and skips), or None if they can.

    They need AVX2 in the target Numba compiles for (``NUMBA_CPU_NAME``/
    ``NUMBA_CPU_FEATURES`` or the host), asked of LLVM itself
    (:func:`.inspect.target_lacks`): with ``NUMBA_CPU_NAME=generic`` there is
    none even on an AVX2 CPU, and the float kernels are used.
    """
    return target_lacks("avx2")


def int8_instructions() -> str:
    """Which integer dot product the int8 kernels are compiled with: ``"avx512-vnni"`` (``vpdpbusd``)
    where Numba's target declares AVX-512 VNNI and VL (:func:`.inspect.target_declares`: the
    host's features, or an explicit ``NUMBA_CPU_FEATURES``), else ``"avx2"`` (``vpmaddubsw`` and
    ``vpmaddwd``). Both give the same int32 sums. Only meaningful where :func:`int8_unavailable`
    is None."""
    return "avx512-vnni" if target_declares("avx512vnni", "avx512vl") else "avx2"


@njit(cache=True)
def quantize_q8_1(x):
    """``x [T, cols]`` float32 -> ``(xq int8 [T, cols], xd [T, nb], xs [T, nb])``, Q8_1 per 32 values.

    ``d = max|x| / 127``, ``q = round(x / d)`` with halves away from zero
    (``floor(|v| + 0.5)`` with the sign of ``v``, as the GPU kernel
    :func:`llmrs_core.kernels.gpu.matvec_int8.quantize_q8_1` and ggml's
    reference code), ``s = d * sum(q)``. Compiled without ``fastmath``: the
    division and rounding are IEEE float32, the same in NumPy. A block holding a NaN or an
    infinity gets that as its scale (and zero codes), so the products it enters are not
    finite either: damaged weights upstream must reach the model's check of the logits, not
    be rounded into int8 codes.
    """
    t_count, cols = x.shape
    nb = cols // 32
    xq = np.empty((t_count, cols), np.int8)
    xd = np.empty((t_count, nb), np.float32)
    xs = np.empty((t_count, nb), np.float32)
    for t in range(t_count):
        for b in range(nb):
            amax = np.float32(0)
            for j in range(32):
                a = abs(x[t, 32 * b + j])
                if a > amax or a != a:  # not max(): a NaN must win (and stay), to reach the products
                    amax = a
            d = amax / np.float32(127)
            inv = np.float32(1) / d if d > 0 else np.float32(0)
            total = 0
            for j in range(32):
                v = x[t, 32 * b + j] * inv
                q = np.int32(np.floor(abs(v) + np.float32(0.5)))
                if v < 0:
                    q = -q
                xq[t, 32 * b + j] = q
                total += q
            xd[t, b] = d
            xs[t, b] = d * np.float32(total)
    return xq, xd, xs


@dataclass
class Int8Rows:
    """A weight matrix ``[rows, cols]`` for the int8 kernels: its rows in groups of :data:`GROUP_ROWS`.

    Within a group, block ``b`` of each of its rows comes before block ``b + 1`` of any, so
    the kernel that takes a group's rows together reads one sequential stream (four rows
    read row by row would be four streams, which a decode step, bound by memory, pays for:
    measured 1.2 to 2 times slower). ``groups = ceil(rows / GROUP_ROWS)``; the last group's
    missing rows are zeros.

    ``kind`` ``"q4"``: ``qs`` uint8 ``[groups, nb * GROUP_ROWS * 16]`` (a block's 16 bytes:
    byte ``j`` holds codes ``j`` and ``j + 16`` in its low and high nibble, GGUF's order),
    ``d``, ``m`` float32 ``[groups, nb * GROUP_ROWS]`` (``w = d q + m``). ``kind`` ``"q8"``:
    ``qs`` int8 ``[groups, nb * GROUP_ROWS * 32]``, ``d`` as above (``w = d q``), ``m`` empty
    ``[0, 0]``. :meth:`row_major` gives the codes and scales back as ``[rows, ...]``.
    """

    kind: str
    rows: int
    cols: int
    qs: np.ndarray
    d: np.ndarray
    m: np.ndarray

    @property
    def nbytes(self) -> int:
        return self.qs.nbytes + self.d.nbytes + self.m.nbytes

    def row_slice(self, start: int, stop: int) -> Int8Rows:
        """Rows ``start:stop`` as views (a part of a fused matrix); ``start`` a multiple of GROUP_ROWS.
        A ``stop`` inside a group keeps that whole group: its extra rows are computed and dropped."""
        if start % GROUP_ROWS:
            raise ValueError(f"row_slice: start {start} is not a multiple of GROUP_ROWS ({GROUP_ROWS})")
        groups = slice(start // GROUP_ROWS, -(-stop // GROUP_ROWS))
        m = self.m[groups] if self.kind == "q4" else self.m
        return Int8Rows(self.kind, stop - start, self.cols, self.qs[groups], self.d[groups], m)

    def row_major(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(qs [rows, nb * bytes per block], d [rows, nb], m [rows, nb] or empty)``: the rows one by one."""
        nb = self.cols // BLOCK

        def rows_first(a: np.ndarray) -> np.ndarray:
            per_block = a.shape[1] // (nb * GROUP_ROWS)
            grouped = a.reshape(a.shape[0], nb, GROUP_ROWS, per_block).transpose(0, 2, 1, 3)
            return grouped.reshape(-1, nb * per_block)[: self.rows]

        m = rows_first(self.m) if self.kind == "q4" else self.m
        return rows_first(self.qs), rows_first(self.d), m


def _grouped(a: np.ndarray, rows: int) -> np.ndarray:
    """Interleaved ``[G, nb, ..., LANES]`` -> ``[ceil(rows / GROUP_ROWS), nb * GROUP_ROWS * ...]``
    (rows in groups, each group block by block; padding rows past the last group dropped)."""
    nb = a.shape[1]
    rows_first = np.moveaxis(a, -1, 1).reshape(a.shape[0] * LANES, nb, -1)  # [G * LANES, nb, per block]
    groups = -(-rows // GROUP_ROWS)
    grouped = rows_first[: groups * GROUP_ROWS].reshape(groups, GROUP_ROWS, nb, -1).transpose(0, 2, 1, 3)
    return np.ascontiguousarray(grouped.reshape(groups, -1))


def int8_rows(w: PackedMatrix) -> Int8Rows | None:
    """The copy of ``w`` the int8 kernels read, or None where they have none.

    They read the Q4 form (Q4_0, Q4_1, Q4_K) and Q8 codes in blocks of 32
    (Q8_0); Q6_K's 16-weight blocks and float matrices stay on the float kernels.
    """
    if w.kind == "q4":
        return Int8Rows("q4", w.rows, w.cols, _grouped(w.qs, w.rows), _grouped(w.d, w.rows), _grouped(w.m, w.rows))
    if w.kind == "q8" and w.qs.shape[2] == BLOCK:
        return Int8Rows("q8", w.rows, w.cols, _grouped(w.qs, w.rows), _grouped(w.d, w.rows),
                        np.zeros((0, 0), np.float32))
    return None


#: activation rows a group of weight rows takes in turn before the next group: their codes
#: (16 x cols bytes) stay in L1 while the group's bytes are read. Longer steps take the
#: weights once per chunk of this many rows, from L2/L3 after the first
CHUNK_ROWS = 16


@njit(parallel=True, cache=True)
def q4_int8_matmul(qs, d, m, xq, xd, xs):
    """``[T, groups * GROUP_ROWS]``: every row of a Q4-form matrix (:class:`Int8Rows`'s arrays)
    against every row of Q8_1 activations.

    The work is cut into (chunk of :data:`CHUNK_ROWS` activation rows, group of weight rows)
    pieces, split across threads; a piece takes its group against each of the chunk's
    activation rows in turn, so the group's bytes come from memory once per chunk and from
    L1 for the other rows (two at a time, :data:`PAIR`: each unpacked weight block serves both),
    and the chunk's activations stay in L1.
    """
    groups, t_count = qs.shape[0], xq.shape[0]
    out = np.empty((t_count, groups * GROUP_ROWS), np.float32)
    chunks = (t_count + CHUNK_ROWS - 1) // CHUNK_ROWS
    for piece in prange(chunks * groups):
        chunk, g = piece // groups, piece % groups
        t, stop = chunk * CHUNK_ROWS, min(t_count, (chunk + 1) * CHUNK_ROWS)
        while t + PAIR <= stop:
            q4_rows_dot_pair(qs, d, m, xq, xd, xs, out, g, t)
            t += PAIR
        if t < stop:
            q4_rows_dot(qs, d, m, xq, xd, xs, out, g, t)
    return out


@njit(parallel=True, cache=True)
def q8_int8_matmul(qs, d, xq, xd):
    """Q8_0 counterpart of :func:`q4_int8_matmul` (no offset term)."""
    groups, t_count = qs.shape[0], xq.shape[0]
    out = np.empty((t_count, groups * GROUP_ROWS), np.float32)
    chunks = (t_count + CHUNK_ROWS - 1) // CHUNK_ROWS
    for piece in prange(chunks * groups):
        chunk, g = piece // groups, piece % groups
        t, stop = chunk * CHUNK_ROWS, min(t_count, (chunk + 1) * CHUNK_ROWS)
        while t + PAIR <= stop:
            q8_rows_dot_pair(qs, d, xq, xd, out, g, t)
            t += PAIR
        if t < stop:
            q8_rows_dot(qs, d, xq, xd, out, g, t)
    return out


def matmul_int8(x: np.ndarray, w: Int8Rows) -> np.ndarray:
    """``x [T, cols] @ W.T -> [T, rows]`` float32 through Q8_1 activations and integer dot products.

    Call only where :func:`int8_unavailable` is None (the kernels are AVX2 code).
    """
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim != 2 or x.shape[1] != w.cols:
        raise ValueError(f"matmul_int8: x has shape {x.shape}, the weight expects [T, {w.cols}]")
    xq, xd, xs = quantize_q8_1(x)
    if w.kind == "q4":
        out = q4_int8_matmul(w.qs, w.d, w.m, xq, xd, xs)
    else:
        out = q8_int8_matmul(w.qs, w.d, xq, xd)
    return out if out.shape[1] == w.rows else out[:, : w.rows]


__all__ = ["GROUP_ROWS", "Int8Rows", "int8_instructions", "int8_rows", "int8_unavailable", "matmul_int8", "q4_int8_matmul", "q8_int8_matmul",
           "quantize_q8_1"]
