"""The int8 decode path: activations quantised to 8 bits, integer dot products (chapter 8, "int8").

llama.cpp's CPU decode does not multiply 4-bit weights by float activations. It quantises ``x``
first, as the weight type's ``vec_dot_type`` says (:mod:`.activations`: Q8_0 or Q8_1 per 32 values,
Q8_K per 256 for the K-quants), to int8 codes ``q_x`` with a scale ``d_x`` per block and
``s_x = d_x * sum(q_x)``. Then per block of weights ``w = d_w q_w + m_w`` (the Q4 form)
or ``w = d_w q_w`` (signed codes)::

    w_b . x_b  ~  d_w d_x (q_w . q_x) + m_w s_x

where ``q_w . q_x`` is a dot product of integers, exact in int32: two AVX2
instructions per 32 weights, or one with AVX-512 VNNI (the intrinsics below). What it costs: each
activation moves by up to half its block's step ``d_x / 2`` (a relative
error of about 1/254 of the block's largest value); rounded as llama.cpp rounds them, the
codes are llama.cpp's own, and the products agree with its to float32 rounding. The K-quants
(Q4_K, Q6_K, Q3_K) apply their integer sub-block scales as ggml does: per super-block of 256,
``sum_b sc_b (q_w . q_x)_b`` (and Q4_K's ``sum_b mn_b sum(q_x)_b``) in int32, then one float step.

The kernels read a copy of each matrix of their own (:class:`Int8Rows`, made
from a :class:`~.packing.PackedMatrix` at load, forms ``"q4"``, ``"q4k"``, ``"q8"``,
``"q4h"``, ``"q8a"``): rows in groups of eight, interleaved four code bytes at a
time, so one integer dot product leaves each row's exact int32 sum in a lane of its
own. The layout and each form's bytes: chapter 8 ("The int8 copy's layout").

:func:`int8_unavailable` is the dispatch: the int8 kernels exist only for x86-64 targets with AVX2,
compiled only when it returns None; :func:`int8_instructions` says which dot product they use.

Shapes: ``x [T, cols]`` float32; ``xq [T, cols]`` int8, ``xd``, ``xs``
``[T, cols / 32]`` float32; output ``[T, rows]`` float32.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.core.errors import TypingError
from numba.extending import intrinsic

from ...quant.kquants import q4_k_parts, q6_k_parts
from ...quant.kquants_low import q3_k_parts
from .activations import PARALLEL_QUANTIZE_ROWS, activation_scheme, quantize_activations
from .packing import BLOCK, LANES, PackedMatrix
from .target import target_declares, target_lacks

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
# ``@intrinsic`` that writes the LLVM IR of a group of eight rows' dot products (the
# loop over their blocks included) with llvmlite's IR builder, and stores them.
# The weight bytes are laid out so that a 32-byte load holds four consecutive codes
# of each of the group's eight rows (:class:`Int8Rows`); the four activation codes
# they meet are one 32-bit word, broadcast to all eight lanes (``vpbroadcastd``).
# One dot product then adds each row's four products into that row's own int32
# lane, and after the block's last load the lanes hold the eight rows' integer
# dot products ``q_w . q_x``, exact. Per block the kernel converts them to float32
# (exactly), and with vectors of the rows' scales and offsets adds
# ``(d_w d_x) (q_w . q_x)`` and ``m_w s_x`` into one float32 accumulator per
# activation row: two fused multiply-adds for eight rows. An earlier layout (a
# group's rows block by block, one row's 32 codes per load) summed each row across
# the lanes instead, and paid a conversion, a scale and a fused multiply-add per row
# and block: two to four times slower at every number of activation rows.
#
# Integer ranges: a Q4 code is 0..15 and an activation code -127..127, so a
# ``vpmaddubsw`` pair is at most 2 * 15 * 127 = 3810 in magnitude, and the AVX2
# branch adds the eight pair sums of a block (its four loads' low and high nibbles)
# in int16 before one ``vpmaddwd``: at most 8 * 3810 = 30480, below the int16 limit
# of 32767, so no sum wraps. The "q8a" codes (Q5_1, Q5_K: 0..31; Q2_K: 0..3) are unsigned
# bytes already, pairs up to 2 * 31 * 127 = 7874, each word's to int32 as below (eight words
# of a block in int16 could reach 62992). Q8 weight codes are signed (-128..127), and
# ``vpmaddubsw`` and ``vpdpbusd`` want their first operand unsigned: as in llama.cpp,
# the weights go in as ``|w|`` and the activations as ``x * sign(w)`` (``vpsignb``),
# pairs up to 2 * 128 * 127 = 32512, so each pair goes to int32 on its own. A block's
# int32 sum is at most 32 * 128 * 127 = 520192 < 2**24, so its conversion to float32
# is exact; the VNNI and AVX2 branches compute the same integers and then the same
# float operations, so their results are the same bits.
#
# These functions call x86 instructions unconditionally: compiling them for a
# CPU without them fails inside LLVM (it aborts the process). Only the kernels
# below call them, and the backend calls those only when int8_unavailable()
# says the target Numba compiles for has AVX2; ``vpdpbusd`` is emitted only where
# the target's feature string declares AVX-512 VNNI and VL (int8_instructions()),
# which a bare NUMBA_CPU_NAME does not: such targets get the AVX2 pair.
#
# Array arguments (C-contiguous, :class:`Int8Rows`'s): ``qs`` uint8
# ``[groups, nb * 4 * 32]`` (per block four 32-byte words, see Int8Rows) or int8
# ``[groups, nb * block / 4 * 32]``; ``d``, ``m`` float32 ``[groups, nb * 8]``; ``xq`` int8
# ``[T, nb * block]``; ``xd``, ``xs`` float32 ``[T, nb]`` (a tile's kernel reads them tile-major:
# ``_Activations``); ``out`` float32 ``[T, groups * 8]``; ``group``, ``t`` integers.

_I8, _I16, _I32, _F32 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.FloatType()
_V32I8 = ir.VectorType(_I8, 32)
_V16I16 = ir.VectorType(_I16, 16)
_V8I32 = ir.VectorType(_I32, 8)
_V8F = ir.VectorType(_F32, 8)

#: rows of a group (:class:`Int8Rows`): one int32 lane each in a 256-bit register
GROUP_ROWS = 8
#: activation rows taken together (a tile): each loaded (and unpacked) weight word serves all of
#: them. Eight where the target has AVX-512's 32 vector registers, four on AVX2's 16, where eight
#: spill. Measured on Llama-3.2-1B's matrices at T = 512, one thread, this machine compiling for
#: each: eight gave 1.3-1.5x (Q6_K's planes 85 -> 128 GOP/s) with AVX-512, 0.7-1.0x as haswell.
#: Each row's numbers are the same in any tile: every activation row has its own accumulators.
X_ROWS = 8 if target_declares("avx512vl") else 4


def _declare(module, name: str, ret, args):
    return cgutils.get_or_insert_function(module, ir.FunctionType(ret, args), name)


def _load(builder, base, index, vector_type):
    """An unaligned load of ``vector_type`` from ``base + index`` (in elements of ``base``)."""
    p = builder.gep(base, [index])
    return builder.load(builder.bitcast(p, vector_type.as_pointer()), align=1)


def _splat(builder, value, vector_type):
    """``value`` in every lane of ``vector_type`` (a broadcast)."""
    v = builder.insert_element(ir.Constant(vector_type, ir.Undefined), value, ir.Constant(_I32, 0))
    mask = ir.Constant(ir.VectorType(_I32, vector_type.count), [0] * vector_type.count)
    return builder.shuffle_vector(v, ir.Constant(vector_type, ir.Undefined), mask)


def _dot_functions(module, vnni: bool):
    """``(fma, vpdpbusd or None, vpmaddubsw or None, vpmaddwd or None)`` declared in ``module``."""
    fma = _declare(module, "llvm.fma.v8f32", _V8F, [_V8F, _V8F, _V8F])
    if vnni:
        return fma, _declare(module, "llvm.x86.avx512.vpdpbusd.256", _V8I32, [_V8I32, _V8I32, _V8I32]), None, None
    return (fma, None, _declare(module, "llvm.x86.avx2.pmadd.ub.sw", _V16I16, [_V32I8, _V32I8]),
            _declare(module, "llvm.x86.avx2.pmadd.wd", _V8I32, [_V16I16, _V16I16]))


def _store_rows(builder, out, out_cols, accs, group, t) -> None:
    """Each activation row's accumulator (the group's eight outputs) into ``out[t + j, 8 group:8 group + 8]``."""
    first_row = builder.mul(group, ir.Constant(group.type, GROUP_ROWS))
    for j, acc in enumerate(accs):
        at = builder.add(builder.mul(builder.add(t, ir.Constant(t.type, j)), out_cols), first_row)
        builder.store(builder.load(acc), builder.bitcast(builder.gep(out, [at]), _V8F.as_pointer()), align=1)


class _Activations:
    """Where the IR finds activation row ``t + j``'s code word ``w`` and scale ``s`` (indices into
    ``xq`` seen as 32-bit words, and into ``xd``, ``xs``, ``xsum``). One row (``n_t`` = 1) reads the
    arrays as quantised, row-major ``[T, n]``; a tile reads them tile-major (:func:`_tile_major`,
    ``[T / n_t, n * n_t]``: tile ``t / n_t``'s rows side by side, element ``(w, j)`` at ``w n_t + j``),
    so that a block's words and scales for the whole tile are one run of memory behind one pointer.
    Row-major, each of the tile's rows needed pointers of its own in each array: more than x86's
    sixteen registers, and LLVM reloaded them from the stack in every block."""

    def __init__(self, builder, t, n_t: int, words_per_row, scales_per_row):
        self.builder, self.n_t = builder, n_t
        self.words_per_row, self.scales_per_row = words_per_row, scales_per_row
        self.t = t if n_t == 1 else builder.udiv(t, ir.Constant(t.type, n_t))  # the row, or the tile

    def _at(self, per_row, j: int, index):
        b, c = self.builder, (lambda v: ir.Constant(index.type, v))
        if self.n_t == 1:
            return b.add(b.mul(b.add(self.t, c(j)), per_row), index)
        return b.add(b.mul(b.add(b.mul(self.t, per_row), index), c(self.n_t)), c(j))

    def word(self, j: int, index):
        """Row ``t + j``'s code word ``index`` (four codes: ``index`` = block * words per block + word)."""
        return self._at(self.words_per_row, j, index)

    def scale(self, j: int, index):
        """Row ``t + j``'s scale (and code sum) ``index``."""
        return self._at(self.scales_per_row, j, index)


def _by_super_block(builder, nb, group, super_scales, xd, x, x_per_super: int, accs, add_block) -> None:
    """The K-quants' loop, in ggml's arithmetic: per super-block of eight 32-weight blocks,
    ``add_block(b, sums)`` adds block ``b``'s integer terms (its dot products times the integer
    sub-block scales) into ``sums[j][i]`` (activation row ``j``'s ``i``-th int32 vector: exact; ``sums``
    are pointers, for ``builder.load``/``store``), then each ``float(sums[j][i]) * (super_scales[i] * d_x)``
    is added into ``accs[j]`` with a fused multiply-add: one float step per 256 weights instead of one per
    block. ``super_scales``: arrays ``[groups, nb / 8 * GROUP_ROWS]`` (Q4_K's ``d`` and ``-dmin``, Q6_K's
    ``d``); ``d_x`` is ``xd`` at the super-block's first of its ``x_per_super`` activation scales (Q8_K's
    one ``d``, repeated per block)."""
    intp = nb.type
    zero = ir.Constant(_V8I32, [0] * 8)
    fma = _declare(builder.module, "llvm.fma.v8f32", _V8F, [_V8F, _V8F, _V8F])
    sums = [[cgutils.alloca_once_value(builder, zero) for _ in super_scales] for _ in accs]
    eight = ir.Constant(intp, 8)
    n_super = builder.udiv(nb, eight)
    with cgutils.for_range(builder, n_super) as outer:
        s = outer.index
        for row in sums:
            for total in row:
                builder.store(zero, total)
        with cgutils.for_range(builder, eight) as inner:
            add_block(builder.add(builder.mul(s, eight), inner.index), sums)
        at_super = builder.mul(builder.add(builder.mul(group, n_super), s), ir.Constant(intp, GROUP_ROWS))
        w_scales = [_load(builder, a, at_super, _V8F) for a in super_scales]
        for j, acc_ptr in enumerate(accs):
            x_at = x.scale(j, builder.mul(s, ir.Constant(intp, x_per_super)))
            x_scale = _splat(builder, builder.load(builder.gep(xd, [x_at])), _V8F)
            acc = builder.load(acc_ptr)
            for total, w_scale in zip(sums[j], w_scales):
                acc = builder.call(fma, [builder.sitofp(builder.load(total), _V8F), builder.fmul(w_scale, x_scale), acc])
            builder.store(acc, acc_ptr)


def _add_into(builder, total, value) -> None:
    """``*total += value`` (an int32 vector)."""
    builder.store(builder.add(builder.load(total), value), total)


def _rows_dot(context, builder, signature, args, form: str, vnni: bool, n_t: int, block: int) -> None:
    """The IR of one group of :data:`GROUP_ROWS` weight rows against ``n_t`` activation rows
    (``t`` onwards), stored into ``out``.

    ``form``: ``"q4"`` (4-bit codes with an offset), ``"q4k"`` (the same with Q4_K's scales as
    stored: per 32 weights 6-bit integers ``sc`` and ``mn``, per 256 float32 ``d`` and ``-dmin``;
    19 bytes per 32 weights instead of 24), ``"q8"`` (signed 8-bit codes) or ``"q8a"``
    (unsigned codes below 128 with an offset: Q5_1, Q5_K, Q2_K). ``block``: weights per scale (32,
    or 16 for ``"q8a"``: Q2_K's sub-blocks). ``vnni``: ``vpdpbusd``
    instead of ``vpmaddubsw`` + ``vpmaddwd`` (the same integers, see above). Each weight
    word is loaded (and for Q4 split into its low and high nibbles) once for all ``n_t``
    activation rows; each activation row has its own int32 and float32 accumulators, so
    their chains do not wait on each other.

    ``"q4k"`` is computed as ggml computes Q4_K (:func:`_by_super_block`): per super-block of 256,
    ``I = sum_b sc_b (q_w . q_x)_b`` and ``M = sum_b mn_b S_b`` (``S_b`` the activations' code sum,
    ``xs`` here: :func:`_code_sums`) in int32, exact (``|I| < 8 * 63 * 60960 < 2^31``), then
    ``acc += I (d d_x) + M (-dmin d_x)``: two fused multiply-adds per 256 weights where a float step
    per block (a conversion, a product of scales, two fused multiply-adds) took the vector pipes
    from the dot products. Measured on Llama-1B's gate matrix at T = 512, one thread: 287-291 -> 300-304
    GOP/s. ``float(I)`` rounds where ``|I| > 2^24``, as ggml's conversion does.
    """
    nibbles, affine, signed, k_scales = form in ("q4", "q4k"), form != "q8", form == "q8", form == "q4k"
    n_arrays = 9 if k_scales else 7 if affine else 5
    arrays = [context.make_array(ty)(context, builder, value)
              for ty, value in zip(signature.args[:n_arrays], args[:n_arrays])]
    if k_scales:  # xs: the activations' int32 code sums per block (_code_sums), not float32 d_x * sum
        qs, d_super, m_super, sc, mn, xq, xd, xs, out = (a.data for a in arrays)
    elif affine:
        qs, d, m, xq, xd, xs, out = (a.data for a in arrays)
    else:
        qs, d, xq, xd, out = (a.data for a in arrays)
    per_group = builder.extract_value(arrays[3 if k_scales else 1].shape, 1)  # d (sc) is [groups, nb * GROUP_ROWS]
    nb = builder.udiv(per_group, ir.Constant(per_group.type, GROUP_ROWS))
    out_cols = builder.extract_value(arrays[-1].shape, 1)  # out is [T, groups * GROUP_ROWS]
    group = context.cast(builder, args[n_arrays], signature.args[n_arrays], types.intp)
    t = context.cast(builder, args[n_arrays + 1], signature.args[n_arrays + 1], types.intp)
    intp = nb.type

    def const(value):
        return ir.Constant(intp, value)

    module = builder.module
    fma, dpbusd, maddubs, maddwd = _dot_functions(module, vnni)
    sign = None if not signed else _declare(module, "llvm.x86.avx2.psign.b", _V32I8, [_V32I8, _V32I8])
    ones = ir.Constant(_V16I16, [1] * 16)
    x_words = builder.bitcast(xq, _I32.as_pointer())  # an activation block is block / 4 words of 4 codes
    per_x_block = block // 4
    words = 4 if nibbles else block // 4  # 32-byte weight words per block of a group (8 rows x 4 codes)
    x = _Activations(builder, t, n_t, builder.mul(nb, const(per_x_block)), nb)

    def block_sums(b, group_block):
        """Block ``b``'s integer dot products: per activation row, the group's eight rows' int32 sums."""
        ints = [ir.Constant(_V8I32, [0] * 8)] * n_t  # per activation row: the 8 rows' int32 sums
        shorts = [ir.Constant(_V16I16, [0] * 16)] * n_t  # the AVX2 Q4 branch's int16 pair sums
        for k in range(words):
            wv = _load(builder, qs, builder.mul(builder.add(builder.mul(group_block, const(words)), const(k)),
                                                const(32)), _V32I8)
            if nibbles:  # codes 4k..4k+3 of each row in the low nibbles, 16+4k.. in the high ones
                parts = [(builder.and_(wv, ir.Constant(_V32I8, [15] * 32)), k),
                         (builder.lshr(wv, ir.Constant(_V32I8, [4] * 32)), 4 + k)]
            elif signed:
                parts = [(builder.call(sign, [wv, wv]), k)]  # |w|, read as unsigned bytes
            else:
                parts = [(wv, k)]  # unsigned codes already
            for j in range(n_t):
                for w_part, word in parts:
                    at = x.word(j, builder.add(builder.mul(b, const(per_x_block)), const(word)))
                    xv = builder.bitcast(_splat(builder, builder.load(builder.gep(x_words, [at]), align=1), _V8I32),
                                         _V32I8)
                    if signed:
                        xv = builder.call(sign, [xv, wv])  # x * sign(w)
                    if vnni:
                        ints[j] = builder.call(dpbusd, [ints[j], builder.bitcast(w_part, _V8I32),
                                                        builder.bitcast(xv, _V8I32)])
                    elif nibbles:
                        shorts[j] = builder.add(shorts[j], builder.call(maddubs, [w_part, xv]))
                    else:
                        pairs = builder.call(maddubs, [w_part, xv])
                        ints[j] = builder.add(ints[j], builder.call(maddwd, [pairs, ones]))
        return [ints[j] if vnni or not nibbles else builder.call(maddwd, [shorts[j], ones]) for j in range(n_t)]

    accs = [cgutils.alloca_once_value(builder, ir.Constant(_V8F, [0.0] * 8)) for _ in range(n_t)]
    if k_scales:  # ggml's Q4_K arithmetic: integer sub-block scales and minimums, a float step per 256

        def integers(a, group_block):  # the block's eight rows' 6-bit scales (or minimums) as int32
            return builder.zext(_load(builder, a, builder.mul(group_block, const(GROUP_ROWS)), ir.VectorType(_I8, 8)),
                                _V8I32)

        def add_block(b, totals):  # sum (sc q_w . q_x) and sum (mn * activation code sum), exact in int32
            group_block = builder.add(builder.mul(group, nb), b)
            sums = block_sums(b, group_block)
            sc_v, mn_v = integers(sc, group_block), integers(mn, group_block)
            for j in range(n_t):
                _add_into(builder, totals[j][0], builder.mul(sums[j], sc_v))
                code_sum = _splat(builder, builder.load(builder.gep(xs, [x.scale(j, b)])), _V8I32)
                _add_into(builder, totals[j][1], builder.mul(mn_v, code_sum))

        # acc += I (d d_x) + M (-dmin d_x)
        _by_super_block(builder, nb, group, (d_super, m_super), xd, x, 8, accs, add_block)
        _store_rows(builder, out, out_cols, accs, group, t)
        return
    with cgutils.for_range(builder, nb) as loop:
        b = loop.index
        group_block = builder.add(builder.mul(group, nb), b)
        sums_by_row = block_sums(b, group_block)
        w_scale = _load(builder, d, builder.mul(group_block, const(GROUP_ROWS)), _V8F)
        w_offset = _load(builder, m, builder.mul(group_block, const(GROUP_ROWS)), _V8F) if affine else None
        for j in range(n_t):
            x_scale = _splat(builder, builder.load(builder.gep(xd, [x.scale(j, b)])), _V8F)
            acc = builder.call(fma, [builder.sitofp(sums_by_row[j], _V8F), builder.fmul(w_scale, x_scale),
                                     builder.load(accs[j])])
            if affine:
                x_sum = _splat(builder, builder.load(builder.gep(xs, [x.scale(j, b)])), _V8F)
                acc = builder.call(fma, [w_offset, x_sum, acc])
            builder.store(acc, accs[j])
    _store_rows(builder, out, out_cols, accs, group, t)


def _high_bits(builder, plane, shift: int, value: int):
    """Bytes of ``value`` or 0: byte ``i`` of lane ``r`` is ``value`` where bit ``shift + i`` of lane ``r``
    of ``plane`` (``<8 x i32>``, one row's 32 bits per lane) is set, for ``i`` in 0..3. Four code
    bytes of each of eight rows, as a code word of :class:`Int8Rows` holds them."""
    v = builder.bitcast(builder.lshr(plane, ir.Constant(_V8I32, [shift] * 8)), _V32I8)
    spread = builder.shuffle_vector(v, ir.Constant(_V32I8, ir.Undefined),
                                    ir.Constant(ir.VectorType(_I32, 32), [4 * (i // 4) for i in range(32)]))
    bits = builder.and_(spread, ir.Constant(_V32I8, [1, 2, 4, 8] * 8))
    zero = ir.Constant(_V32I8, [0] * 32)
    return builder.select(builder.icmp_unsigned("!=", bits, zero), ir.Constant(_V32I8, [value] * 32), zero)


def _crumbs(builder, word, k: int):
    """Bits 4 and 5 of four codes of each of eight rows, from a crumb word (:func:`int8_rows_planes`):
    byte ``4r + i`` of ``word`` holds the high bits of code ``4k' + i`` (of its half) at bits ``2k'``,
    ``2k' + 1``; this moves crumb ``k`` to bits 4, 5 of each byte: a shift and a mask."""
    v = builder.bitcast(word, _V32I8)
    shift = 4 - 2 * k
    if shift > 0:
        v = builder.shl(v, ir.Constant(_V32I8, [shift] * 32))
    elif shift < 0:
        v = builder.lshr(v, ir.Constant(_V32I8, [-shift] * 32))
    return builder.and_(v, ir.Constant(_V32I8, [0x30] * 32))


def _rows_dot_planes(context, builder, signature, args, hbits: int, bias: int, block: int, k_scales: bool,
                     vnni: bool, n_t: int) -> None:
    """The ``"q4h"`` form's IR (:class:`Int8Rows`): a code is its nibble plus ``hbits`` high bits
    from bit planes, minus ``bias``. Per 32-code block, four nibble words and ``hbits`` plane words
    give unsigned codes (``_high_bits``; with two high bits, crumb words instead: ``_crumbs``); their
    integer products with the activation codes, less ``bias`` times the activations' code sum
    (``xsum`` holds that product, :func:`_code_sums`: an integer, so the bias is applied exactly, as
    ggml subtracts it), are scaled per ``block`` (32, or 16: the low nibbles' half and the high
    nibbles' half then have scales of their own). ``k_scales``: the scales as a K-quant stores them,
    ``d`` per 256 weights and an integer ``sc`` per block, applied as ggml applies them
    (:func:`_by_super_block`): ``sum sc (q_w . q_x - bias S)`` in int32 over a super-block (at most
    16 * 128 * 32 * 127 * 16 < 2^31), then one fused multiply-add by ``d d_x``. Measured on Llama-1B's
    Q6_K down matrix at T = 512, one thread: 220 -> 250 GOP/s against a float step per 16 weights.
    Arguments ``qs, qh, d, sc, xq, xd, xsum, out, group, t`` (``sc`` unused without ``k_scales``).
    """
    arrays = [context.make_array(ty)(context, builder, value) for ty, value in zip(signature.args[:8], args[:8])]
    qs, qh, d, sc, xq, xd, xsum, out = (a.data for a in arrays)
    per_group = builder.extract_value(arrays[3 if k_scales else 2].shape, 1)  # [groups, n_scales * GROUP_ROWS]
    n_scales = builder.udiv(per_group, ir.Constant(per_group.type, GROUP_ROWS))
    halves = 32 // block  # scales per 32-code block
    nb = builder.udiv(n_scales, ir.Constant(n_scales.type, halves))
    out_cols = builder.extract_value(arrays[-1].shape, 1)
    group = context.cast(builder, args[8], signature.args[8], types.intp)
    t = context.cast(builder, args[9], signature.args[9], types.intp)
    intp = nb.type

    def const(value):
        return ir.Constant(intp, value)

    module = builder.module
    fma, dpbusd, maddubs, maddwd = _dot_functions(module, vnni)
    ones = ir.Constant(_V16I16, [1] * 16)
    x_words = builder.bitcast(xq, _I32.as_pointer())
    planes_ptr = builder.bitcast(qh, _V8I32.as_pointer())
    x = _Activations(builder, t, n_t, builder.mul(nb, const(8)), n_scales)

    def block_sums(b, group_block):
        """Block ``b``'s integer dot products less the bias term: ``[activation row][scale of the block]``."""
        planes = [builder.load(builder.gep(planes_ptr, [builder.add(builder.mul(group_block, const(hbits)),
                                                                    const(p))]), align=1) for p in range(hbits)]
        zero_ints = ir.Constant(_V8I32, [0] * 8)
        ints = [[zero_ints] * halves for _ in range(n_t)]  # per activation row, per scale of the block
        for k in range(4):
            wv = _load(builder, qs, builder.mul(builder.add(builder.mul(group_block, const(4)), const(k)), const(32)),
                       _V32I8)
            for half, (codes, shift) in enumerate(((builder.and_(wv, ir.Constant(_V32I8, [15] * 32)), 4 * k),
                                                   (builder.lshr(wv, ir.Constant(_V32I8, [4] * 32)), 16 + 4 * k))):
                if hbits == 2:  # the half's crumb word: code 4k + i's two bits at bits 2k, 2k + 1 of byte i
                    codes = builder.or_(codes, _crumbs(builder, planes[half], k))
                else:
                    for p, plane in enumerate(planes):
                        codes = builder.or_(codes, _high_bits(builder, plane, shift, 16 << p))
                word = 4 * half + k  # codes 4k.. (low nibbles) or 16 + 4k.. (high ones) of the block
                for j in range(n_t):
                    at = x.word(j, builder.add(builder.mul(b, const(8)), const(word)))
                    xv = builder.bitcast(_splat(builder, builder.load(builder.gep(x_words, [at]), align=1), _V8I32),
                                         _V32I8)
                    h = half if halves == 2 else 0
                    if vnni:
                        ints[j][h] = builder.call(dpbusd, [ints[j][h], builder.bitcast(codes, _V8I32),
                                                           builder.bitcast(xv, _V8I32)])
                    else:
                        pairs = builder.call(maddubs, [codes, xv])
                        ints[j][h] = builder.add(ints[j][h], builder.call(maddwd, [pairs, ones]))
        if bias:  # xsum holds bias times the code sum (_code_sums)
            for j in range(n_t):
                for h in range(halves):
                    at = x.scale(j, builder.add(builder.mul(b, const(halves)), const(h)))
                    ints[j][h] = builder.sub(ints[j][h], _splat(builder, builder.load(builder.gep(xsum, [at])), _V8I32))
        return ints

    accs = [cgutils.alloca_once_value(builder, ir.Constant(_V8F, [0.0] * 8)) for _ in range(n_t)]
    if k_scales:  # ggml's arithmetic: the int8 sub-block scales in integers, a float step per 256

        def add_block(b, totals):
            group_block = builder.add(builder.mul(group, nb), b)
            ints = block_sums(b, group_block)
            for h in range(halves):
                scale_block = builder.add(builder.mul(group_block, const(halves)), const(h))
                sc_v = builder.sext(_load(builder, sc, builder.mul(scale_block, const(GROUP_ROWS)), ir.VectorType(_I8, 8)),
                                    _V8I32)
                for j in range(n_t):
                    _add_into(builder, totals[j][0], builder.mul(ints[j][h], sc_v))

        _by_super_block(builder, nb, group, (d,), xd, x, 8 * halves, accs, add_block)
        _store_rows(builder, out, out_cols, accs, group, t)
        return
    with cgutils.for_range(builder, nb) as loop:
        b = loop.index
        group_block = builder.add(builder.mul(group, nb), b)
        ints = block_sums(b, group_block)
        for h in range(halves):
            w_scale = _load(builder, d, builder.mul(builder.add(builder.mul(group_block, const(halves)), const(h)),
                                                    const(GROUP_ROWS)), _V8F)
            for j in range(n_t):
                x_scale = _splat(builder, builder.load(builder.gep(xd, [x.scale(j, builder.add(
                    builder.mul(b, const(halves)), const(h)))])), _V8F)
                acc = builder.call(fma, [builder.sitofp(ints[j][h], _V8F), builder.fmul(w_scale, x_scale),
                                         builder.load(accs[j])])
                builder.store(acc, accs[j])
    _store_rows(builder, out, out_cols, accs, group, t)


def _planes_intrinsic(hbits: int, bias: int, block: int, k_scales: bool, n_t: int):
    """The ``"q4h"`` counterpart of :func:`_rows_intrinsic`, for one :data:`PLANE_FORMS` variant."""
    def typer(typingctx, qs, qh, d, sc, xq, xd, xsum, out, group, t):
        _check_arrays(qs, qh, d, sc, xq, xd, xsum, out)
        return types.void(qs, qh, d, sc, xq, xd, xsum, out, group, t), codegen

    def codegen(context, builder, signature, args):
        _rows_dot_planes(context, builder, signature, args, hbits, bias, block, k_scales,
                         int8_instructions() == "avx512-vnni", n_t)
        return context.get_dummy_value()

    typer.__name__ = f"q4h{hbits}_{bias}_{block}_rows_dot_{GROUP_ROWS}x{n_t}"
    return intrinsic(typer)


def _check_arrays(*arrays) -> None:
    """The IR indexes raw data pointers: only C-contiguous 2-D arrays are laid out as it assumes."""
    for a in arrays:
        if not (isinstance(a, types.Array) and a.ndim == 2 and a.layout == "C"):
            raise TypingError(f"the int8 row dot products read C-contiguous 2-D arrays; got {a}")


def _rows_intrinsic(form: str, n_t: int, block: int = 32):
    """An ``@intrinsic`` storing ``out[t:t + n_t, g * GROUP_ROWS:(g + 1) * GROUP_ROWS]``: group ``g``
    of the weight's rows against rows ``t`` to ``t + n_t - 1`` of the activations. Which
    instructions it emits is decided when a kernel calling it is compiled, for the target Numba
    compiles for (:func:`int8_instructions`)."""
    if form == "q4k":
        def typer(typingctx, qs, d_super, m_super, sc, mn, xq, xd, xsum, out, group, t):
            _check_arrays(qs, d_super, m_super, sc, mn, xq, xd, xsum, out)
            return types.void(qs, d_super, m_super, sc, mn, xq, xd, xsum, out, group, t), codegen
    elif form != "q8":
        def typer(typingctx, qs, d, m, xq, xd, xs, out, group, t):
            _check_arrays(qs, d, m, xq, xd, xs, out)
            return types.void(qs, d, m, xq, xd, xs, out, group, t), codegen
    else:
        def typer(typingctx, qs, d, xq, xd, out, group, t):
            _check_arrays(qs, d, xq, xd, out)
            return types.void(qs, d, xq, xd, out, group, t), codegen

    def codegen(context, builder, signature, args):
        _rows_dot(context, builder, signature, args, form, int8_instructions() == "avx512-vnni", n_t, block)
        return context.get_dummy_value()

    typer.__name__ = f"{form}_{block}_rows_dot_{GROUP_ROWS}x{n_t}"
    return intrinsic(typer)


q4_rows_dot = _rows_intrinsic("q4", n_t=1)
q4_rows_dot_tile = _rows_intrinsic("q4", n_t=X_ROWS)
q4k_rows_dot = _rows_intrinsic("q4k", n_t=1)
q4k_rows_dot_tile = _rows_intrinsic("q4k", n_t=X_ROWS)
q8_rows_dot = _rows_intrinsic("q8", n_t=1)
q8_rows_dot_tile = _rows_intrinsic("q8", n_t=X_ROWS)
q8a_rows_dot = _rows_intrinsic("q8a", n_t=1)
q8a_rows_dot_tile = _rows_intrinsic("q8a", n_t=X_ROWS)
q8a_16_rows_dot = _rows_intrinsic("q8a", n_t=1, block=16)
q8a_16_rows_dot_tile = _rows_intrinsic("q8a", n_t=X_ROWS, block=16)


#: the ``"q4h"`` variants: (high bits, bias, weights per scale, K-quant scales) by the GGML type they
#: hold. Q5_0: ``q - 16`` with five bits, float32 ``d`` per 32; Q6_K: ``q - 32`` with six, ``d`` per
#: 256 times an int8 ``sc`` per 16; Q3_K: ``q - 4``, three bits, likewise ``d (s - 32)`` per 16
PLANE_FORMS = {"Q5_0": (1, 16, 32, False), "Q6_K": (2, 32, 16, True), "Q3_K": (0, 4, 16, True)}
q5_0_rows_dot, q5_0_rows_dot_tile = (_planes_intrinsic(*PLANE_FORMS["Q5_0"], n_t) for n_t in (1, X_ROWS))
q6_k_rows_dot, q6_k_rows_dot_tile = (_planes_intrinsic(*PLANE_FORMS["Q6_K"], n_t) for n_t in (1, X_ROWS))
q3_k_rows_dot, q3_k_rows_dot_tile = (_planes_intrinsic(*PLANE_FORMS["Q3_K"], n_t) for n_t in (1, X_ROWS))


def int8_unavailable() -> str | None:
    """Why the int8 kernels cannot run here (a reason, for reports and skips), or None if they can.

    They need AVX2 in the target Numba compiles for (``NUMBA_CPU_NAME``/
    ``NUMBA_CPU_FEATURES`` or the host), asked of LLVM itself
    (:func:`.target.target_lacks`): with ``NUMBA_CPU_NAME=generic`` there is
    none even on an AVX2 CPU, and the float kernels are used.
    """
    return target_lacks("avx2")


def int8_instructions() -> str:
    """Which integer dot product the int8 kernels are compiled with: ``"avx512-vnni"`` (``vpdpbusd``)
    where Numba's target declares AVX-512 VNNI and VL (:func:`.target.target_declares`: the
    host's features, or an explicit ``NUMBA_CPU_FEATURES``), else ``"avx2"`` (``vpmaddubsw`` and
    ``vpmaddwd``). Both give the same int32 sums. Only meaningful where :func:`int8_unavailable`
    is None."""
    return "avx512-vnni" if target_declares("avx512vnni", "avx512vl") else "avx2"


def quantize_q8_1(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``x [T, cols]`` -> ``(xq int8 [T, cols], xd [T, cols / 32], xs [T, cols / 32])``: ggml's Q8_1 of
    ``x`` per 32 values, what a Q4_1 matrix multiplies (:func:`.activations.quantize_activations`)."""
    return quantize_activations(np.ascontiguousarray(x, dtype=np.float32), "q8_1")


@dataclass
class Int8Rows:
    """A weight matrix ``[rows, cols]`` for the int8 kernels: its rows in groups of :data:`GROUP_ROWS`.

    Within a group, block ``b`` of all eight rows comes before block ``b + 1``, so a group is
    one sequential stream (decode, bound by memory, pays for several streams). Within a
    block the codes come in 32-byte words: word ``k`` holds four code bytes of each row,
    row 0's first (``[row, 4 bytes]``), so that an integer dot product leaves each row's sum
    in a 32-bit lane of its own. ``groups = ceil(rows / GROUP_ROWS)``; the last group's
    missing rows are zeros.

    ``kind`` ``"q4"``: ``qs`` uint8 ``[groups, nb * 4 * 32]``, word ``k`` of a block holding
    bytes ``4k..4k+3`` of each row's 16 (byte ``j`` holds codes ``j`` and ``j + 16`` in its
    low and high nibble, GGUF's order); ``d``, ``m`` float32 ``[groups, nb * GROUP_ROWS]``, the
    block's eight rows side by side (``w = d q + m``). ``kind`` ``"q8"``: ``qs`` int8
    ``[groups, nb * block / 4 * 32]``, word ``k`` holding codes ``4k..4k+3`` of each row; ``d`` as
    above (``w = d q``), ``m`` empty ``[0, 0]``. ``kind`` ``"q8a"``: unsigned codes laid out as
    ``"q8"``'s, with ``m`` as ``"q4"``'s (``w = d q + m``). ``kind`` ``"q4k"``: ``"q4"``'s codes, ``d``
    and ``m`` per 256 weights (``d``, ``-dmin``) and ``sc``, ``mn`` uint8 per 32 (``w = d sc q - dmin mn``).
    ``kind`` ``"q4h"``: ``"q4"``'s nibbles plus ``qh`` bit planes (:func:`int8_rows_planes`), ``w = d (q
    - bias)`` with ``d`` per ``block``, or ``d`` per 256 times ``sc`` int8 per ``block`` (K-quants).
    :meth:`row_major` gives the codes and scales back as ``[rows, ...]``.
    """

    kind: str
    rows: int
    cols: int
    qs: np.ndarray
    d: np.ndarray
    m: np.ndarray
    #: how the activations are quantised for it (``activations.ACTIVATION_SCHEME`` of its GGML type)
    scheme: str = "q8_0"
    #: weights per scale: 32, or 16 for Q8 codes (Q6_K, Q3_K)
    block: int = BLOCK
    #: ``"q4h"``: the high bits' planes (or crumb words), uint8 ``[groups, nb * hbits * 32]``; the GGML type's
    #: :data:`PLANE_FORMS` variant
    qh: np.ndarray | None = None
    variant: str = ""
    #: ``"q4k"``: the sub-blocks' integer scales and mins, uint8 ``[groups, nb * GROUP_ROWS]`` each (then
    #: ``d`` and ``m`` are per 256 weights: ``d`` and ``-dmin``, ``[groups, nb / 8 * GROUP_ROWS]``)
    sc: np.ndarray | None = None
    mn: np.ndarray | None = None

    @functools.cached_property
    def kernel_args(self) -> tuple:
        """``(form, qs, d, m, qh, sc, mn)`` as :func:`int8_matmul` takes them: the form's integer, the
        code bytes as uint8 (a ``"q8"`` copy's int8 codes seen as bytes: the kernels read bits),
        and a placeholder for each array the form has none of, so every form has the same types."""
        if self.kind == "q4h":
            form = _PLANE_FORM[self.variant]
        else:
            form = {"q4": FORM_Q4, "q4k": FORM_Q4K, "q8": FORM_Q8}.get(self.kind, FORM_Q8A if self.block == 32 else FORM_Q8A16)

        def given(a: np.ndarray | None, placeholder: np.ndarray) -> np.ndarray:
            return placeholder if a is None else a.view(np.uint8)

        return (form, self.qs.view(np.uint8), self.d, self.m, given(self.qh, _NO_PLANES), given(self.sc, _NO_SCALES),
                given(self.mn, _NO_SCALES))

    @property
    def nbytes(self) -> int:
        extra = (self.qh, self.sc, self.mn)
        return self.qs.nbytes + self.d.nbytes + self.m.nbytes + sum(a.nbytes for a in extra if a is not None)

    @staticmethod
    def stack(parts: list[Int8Rows]) -> Int8Rows | None:
        """The copies of matrices fused into one (the rows of each after the last), or None where their
        forms differ or a part's rows are not whole groups."""
        first = parts[0]
        same = {(p.kind, p.scheme, p.block, p.variant, p.cols) for p in parts}
        if len(same) != 1 or any(p.rows % GROUP_ROWS for p in parts[:-1]):
            return None

        def cat(name: str) -> np.ndarray | None:
            arrays = [getattr(p, name) for p in parts]
            if arrays[0] is None or (name == "m" and first.kind == "q8"):
                return arrays[0]
            return np.concatenate(arrays)

        return Int8Rows(first.kind, sum(p.rows for p in parts), first.cols, cat("qs"), cat("d"), cat("m"), first.scheme,
                        first.block, cat("qh"), first.variant, cat("sc"), cat("mn"))

    def row_slice(self, start: int, stop: int) -> Int8Rows:
        """Rows ``start:stop`` as views (a part of a fused matrix); ``start`` a multiple of GROUP_ROWS.
        A ``stop`` inside a group keeps that whole group: its extra rows are computed and dropped."""
        if start % GROUP_ROWS:
            raise ValueError(f"row_slice: start {start} is not a multiple of GROUP_ROWS ({GROUP_ROWS})")
        groups = slice(start // GROUP_ROWS, -(-stop // GROUP_ROWS))
        m = self.m if self.kind == "q8" else self.m[groups]
        def part(a: np.ndarray | None) -> np.ndarray | None:
            return None if a is None else a[groups]

        return Int8Rows(self.kind, stop - start, self.cols, self.qs[groups], self.d[groups], m, self.scheme,
                        self.block, part(self.qh), self.variant, part(self.sc), part(self.mn))

    def row_major(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(qs [rows, nb * bytes per block], d [rows, nb], m [rows, nb] or empty)``: the rows one by one."""
        if self.kind == "q4h":
            d = self._row_scales(self.d)
            if self.sc is not None:  # d per 256 times sc per 16
                d = np.repeat(d, 256 // self.block, axis=1) * self._row_scales(self.sc).astype(np.float32)
            return self._plane_codes(), d, self.m
        if self.kind == "q4k":  # the scales as the kernel forms them
            per = np.repeat(self._row_scales(self.d), 8, axis=1), np.repeat(self._row_scales(self.m), 8, axis=1)
            d, m = per[0] * self._row_scales(self.sc).astype(np.float32), per[1] * self._row_scales(self.mn).astype(np.float32)
            return Int8Rows("q4", self.rows, self.cols, self.qs, self.d, self.m).row_major()[0], d, m
        nb = self.cols // self.block
        groups = self.qs.shape[0]
        codes = self.qs.reshape(groups, nb, -1, GROUP_ROWS, 4).transpose(0, 3, 1, 2, 4)
        qs = codes.reshape(groups * GROUP_ROWS, -1)[: self.rows]

        return qs, self._row_scales(self.d), self.m if self.kind == "q8" else self._row_scales(self.m)

    def _row_scales(self, a: np.ndarray) -> np.ndarray:
        """``[groups, nb * GROUP_ROWS]`` -> ``[rows, nb]``."""
        nb = a.shape[1] // GROUP_ROWS
        return a.reshape(-1, nb, GROUP_ROWS).transpose(0, 2, 1).reshape(-1, nb)[: self.rows]

    def _plane_codes(self) -> np.ndarray:
        """A ``"q4h"`` copy's codes as int8 ``[rows, cols]`` (the stored ones less the bias)."""
        hbits, bias, _, _ = PLANE_FORMS[self.variant]
        groups, nb = self.qs.shape[0], self.cols // 32
        nibbles = self.qs.reshape(groups, nb, 4, GROUP_ROWS, 4).transpose(0, 3, 1, 2, 4).reshape(groups * 8, nb, 16)
        codes = np.concatenate([nibbles & 15, nibbles >> 4], axis=2).astype(np.int16)  # [rows, nb, 32]
        if hbits == 2:  # crumb words: see int8_rows_planes
            crumbs = self.qh.reshape(groups, nb, 2, GROUP_ROWS, 4).transpose(0, 3, 1, 2, 4).astype(np.int16)
            high = (crumbs[:, :, :, :, None, :] >> (2 * np.arange(4, dtype=np.int16))[:, None]) & 3  # [.., h, k, i]
            codes |= high.reshape(groups * GROUP_ROWS, nb, 32) << 4
        elif hbits:
            words = self.qh.reshape(groups, nb, hbits, GROUP_ROWS, 4).transpose(0, 3, 1, 2, 4).copy()
            bits = words.view(np.uint32)[..., 0]  # [groups, 8, nb, hbits]: bit j is code j's bit 4 + p
            bits = bits.reshape(groups * GROUP_ROWS, nb, hbits)
            for p in range(hbits):
                codes |= (((bits[:, :, p, None] >> np.arange(32, dtype=np.uint32)) & 1) << (4 + p)).astype(np.int16)
        return (codes - bias).astype(np.int8).reshape(groups * GROUP_ROWS, self.cols)[: self.rows]


def _rows_first(a: np.ndarray, rows: int) -> np.ndarray:
    """Interleaved ``[G, nb, per block, LANES]`` -> ``[groups * GROUP_ROWS, nb, per block]``, the rows
    one by one, zero rows after the last up to a whole group (padding rows past it dropped)."""
    nb = a.shape[1]
    out = np.moveaxis(a, -1, 1).reshape(a.shape[0] * LANES, nb, -1)
    need = -(-rows // GROUP_ROWS) * GROUP_ROWS
    if out.shape[0] < need:
        out = np.concatenate([out, np.zeros((need - out.shape[0], *out.shape[1:]), out.dtype)])
    return out[:need]


def _grouped_codes(qs: np.ndarray, rows: int) -> np.ndarray:
    """Interleaved codes ``[G, nb, bytes per block, LANES]`` -> ``[groups, nb * bytes per block * GROUP_ROWS]``:
    per group and block, words of four bytes of each of the group's rows."""
    return _words(_rows_first(qs, rows))


def _pad_rows(a: np.ndarray) -> np.ndarray:
    """``[rows, ...]`` -> ``[groups * GROUP_ROWS, ...]``, zero rows after the last."""
    need = -(-a.shape[0] // GROUP_ROWS) * GROUP_ROWS
    return np.concatenate([a, np.zeros((need - a.shape[0], *a.shape[1:]), a.dtype)]) if need > a.shape[0] else a


def _words(codes: np.ndarray) -> np.ndarray:
    """Codes ``[groups * GROUP_ROWS, nb, bytes per block]`` -> the grouped word layout (:class:`Int8Rows`)."""
    groups, nb, per_block = codes.shape[0] // GROUP_ROWS, codes.shape[1], codes.shape[2]
    words = codes.reshape(groups, GROUP_ROWS, nb, per_block // 4, 4).transpose(0, 2, 3, 1, 4)
    return np.ascontiguousarray(words.reshape(groups, -1))


def _grouped_scales(a: np.ndarray, rows: int) -> np.ndarray:
    """Interleaved scales ``[G, nb, LANES]`` -> ``[groups, nb * GROUP_ROWS]``: per block the group's rows."""
    return _scale_words(_rows_first(a[:, :, None, :], rows)[:, :, 0])


def _scale_words(s: np.ndarray) -> np.ndarray:
    """Scales ``[groups * GROUP_ROWS, nb]`` -> ``[groups, nb * GROUP_ROWS]``: per block the group's rows."""
    groups, nb = s.shape[0] // GROUP_ROWS, s.shape[1]
    return np.ascontiguousarray(s.reshape(groups, GROUP_ROWS, nb).transpose(0, 2, 1).reshape(groups, -1))


def int8_rows(w: PackedMatrix) -> Int8Rows | None:
    """The copy of ``w`` the int8 kernels read, or None where they have none.

    They read the Q4 form (Q4_0, Q4_1, Q4_K) and Q8 codes in blocks of 32 (Q8_0, Q5_0, IQ4_NL,
    IQ4_XS) or 16 (Q6_K, Q3_K), for a matrix whose type names its activation quantisation
    (``w.source``, see :func:`.activations.activation_scheme`). Float matrices, and a fused matrix
    whose parts' schemes differ, stay on the float kernels.
    """
    scheme = activation_scheme(w.source)
    if scheme is None or w.kind not in ("q4", "q8"):
        return None
    if w.kind == "q4":
        return Int8Rows("q4", w.rows, w.cols, _grouped_codes(w.qs, w.rows), _grouped_scales(w.d, w.rows),
                        _grouped_scales(w.m, w.rows), scheme, BLOCK)
    types_ = set(w.source.split("+"))  # a fused matrix's parts: "Q5_0+Q5_0+Q8_0"
    variant = types_.pop() if len(types_) == 1 else None
    if variant in PLANE_FORMS and PLANE_FORMS[variant][3]:
        return None  # Q6_K, Q3_K: their copy keeps the integer scales, which only the stored bytes hold
    if variant in PLANE_FORMS:  # fewer bytes than 8-bit codes: see PLANE_FORMS
        codes = _rows_first(w.qs, w.rows)[: w.rows].reshape(w.rows, w.cols)
        return int8_rows_planes(codes, _rows_first(w.d[:, :, None, :], w.rows)[: w.rows, :, 0], variant, scheme)
    if w.qs.shape[2] != BLOCK:
        return None  # 16-weight blocks of mixed types (fuse keeps them apart): no 8-bit kernel of that form
    return Int8Rows("q8", w.rows, w.cols, _grouped_codes(w.qs, w.rows), _grouped_scales(w.d, w.rows),
                    np.zeros((0, 0), np.float32), scheme, w.qs.shape[2])


def int8_rows_planes(codes: np.ndarray, scales: np.ndarray | tuple[np.ndarray, np.ndarray], variant: str,
                     scheme: str) -> Int8Rows:
    """The ``"q4h"`` copy of signed codes int8 ``[rows, cols]`` for the GGML type ``variant``
    (:data:`PLANE_FORMS`): each code plus the bias as a nibble (laid out as the Q4 form's) and
    ``hbits`` bit planes (per 32-code block and plane, one 32-byte word: row ``r``'s 32 bits in lane
    ``r``, bit ``j`` being bit ``4 + p`` of code ``j``), or with two high bits (Q6_K) as many crumb
    words (2-bit fields, see below). ``scales``: float32 ``[rows, cols / block]``,
    or for a K-quant variant ``(d float32 [rows, cols / 256], sc int8 [rows, cols / block])``."""
    hbits, bias, block, k_scales = PLANE_FORMS[variant]
    rows, cols = codes.shape
    nb = cols // 32
    u = _pad_rows((codes.astype(np.int16) + bias).astype(np.uint8).reshape(rows, nb, 32))
    nibbles = (u[:, :, :16] & 15) | ((u[:, :, 16:] & 15) << 4)  # GGUF's order: code j low, j + 16 high
    qh = None
    groups = u.shape[0] // GROUP_ROWS
    if hbits == 2:
        # crumb word h of a block (h = 0: codes 0..15, 1: 16..31): byte i of row r holds bits 4, 5 of
        # code 16 h + 4 k + i at its bits 2 k, 2 k + 1, k = 0..3, so that the kernel takes a nibble
        # word's four codes' high bits with one shift and one mask (two bit planes took ten operations)
        high = ((u >> 4) & 3).reshape(-1, nb, 2, 4, 4)  # [rows_pad, nb, h, k, i]
        crumbs = high[:, :, :, 0] | (high[:, :, :, 1] << 2) | (high[:, :, :, 2] << 4) | (high[:, :, :, 3] << 6)
        qh = np.ascontiguousarray(crumbs.reshape(groups, GROUP_ROWS, nb, 2, 4).transpose(0, 2, 3, 1, 4)
                                  ).astype(np.uint8).reshape(groups, -1)
    elif hbits:
        # plane p of a block: bit j of a little-endian 32-bit word is bit 4 + p of code j (packbits: 8 codes a byte)
        planes = np.stack([np.packbits((u >> (4 + p)) & 1, axis=-1, bitorder="little").view("<u4")[..., 0]
                           for p in range(hbits)], axis=-1)  # [rows_pad, nb, hbits]
        qh = np.ascontiguousarray(planes.reshape(groups, GROUP_ROWS, nb, hbits).transpose(0, 2, 3, 1)
                                  ).view(np.uint8).reshape(groups, -1)
    d, sc = scales if k_scales else (scales, None)
    return Int8Rows("q4h", rows, cols, _words(nibbles), _scale_words(_pad_rows(d.astype(np.float32))),
                    np.zeros((0, 0), np.float32), scheme, block, qh, variant,
                    sc=None if sc is None else _scale_words(_pad_rows(sc.astype(np.int8))))


def int8_rows_from_blocks(raw: np.ndarray, ggml_type: str, shape: tuple[int, int]) -> Int8Rows | None:
    """The copy of a K-quant matrix whose form keeps its scales as stored, from its bytes: Q4_K's
    ``"q4k"``, Q6_K's and Q3_K's ``"q4h"``; None for another type (see :func:`int8_rows`)."""
    rows, cols = shape
    if ggml_type == "Q4_K":
        return int8_rows_q4_k(raw, shape)
    parts = {"Q6_K": q6_k_parts, "Q3_K": q3_k_parts}.get(ggml_type)
    if parts is None:
        return None
    q, d, sc = parts(raw)
    return int8_rows_planes(q.reshape(rows, cols), (d.reshape(rows, -1), sc.reshape(rows, -1)), ggml_type, "q8_k")


def int8_rows_q4_k(raw: np.ndarray, shape: tuple[int, int]) -> Int8Rows:
    """The ``"q4k"`` copy of a Q4_K matrix ``[rows, cols]`` from its stored bytes: the Q4 form's code
    words, and the scales as stored (:class:`Int8Rows`)."""
    rows, cols = shape
    q, d, dmin, sc, mn = q4_k_parts(raw)
    per_super = (rows, cols // 256)
    return int8_rows_q4_k_parts(q.reshape(rows, cols), d.reshape(per_super), dmin.reshape(per_super),
                                sc.reshape(rows, -1), mn.reshape(rows, -1))


def int8_rows_q4_k_parts(codes: np.ndarray, d: np.ndarray, dmin: np.ndarray, sc: np.ndarray,
                         mn: np.ndarray) -> Int8Rows:
    """The ``"q4k"`` copy of ``w = d sc q - dmin mn``: codes uint8 ``[rows, cols]`` (0..15), ``d``, ``dmin``
    float32 ``[rows, cols / 256]``, ``sc``, ``mn`` uint8 ``[rows, cols / 32]`` (0..63)."""
    rows, cols = codes.shape
    nb = cols // 32
    blocks = codes.astype(np.uint8).reshape(rows, nb, 32)
    nibbles = _pad_rows(blocks[:, :, :16] | (blocks[:, :, 16:] << 4))
    return Int8Rows("q4k", rows, cols, _words(nibbles), _scale_words(_pad_rows(d.astype(np.float32))),
                    _scale_words(_pad_rows(-dmin.astype(np.float32))), "q8_k", BLOCK,
                    sc=_scale_words(_pad_rows(sc.astype(np.uint8))), mn=_scale_words(_pad_rows(mn.astype(np.uint8))))


def int8_rows_unsigned(codes: np.ndarray, d: np.ndarray, m: np.ndarray, source: str) -> Int8Rows | None:
    """The ``"q8a"`` copy of a matrix ``w = d q + m`` with unsigned codes below 128 that no packed form
    holds (Q5_1, Q5_K, Q2_K, kept as float32 for the float kernels): codes uint8 ``[rows, cols]``,
    ``d``, ``m`` float32 ``[rows, cols / block]``. None where ``source`` names no activation scheme."""
    scheme = activation_scheme(source)
    if scheme is None:
        return None
    rows, cols = codes.shape
    nb = d.shape[1]
    grouped = _words(_pad_rows(codes.astype(np.uint8).reshape(rows, nb, cols // nb)))
    return Int8Rows("q8a", rows, cols, grouped, _scale_words(_pad_rows(d.astype(np.float32))),
                    _scale_words(_pad_rows(m.astype(np.float32))), scheme, cols // nb)


#: activation rows a group of weight rows takes in turn before the next group: the group's bytes
#: (a few KB) come from memory once and stay in L1 for all of them, while the chunk's activation
#: codes (up to 512 x cols bytes, tile-major) stream from L2/L3. Measured at T = 512 on Llama-1B's
#: fused gate/up (16384 x 2048, Q4_K) and down (Q6_K) matrices against chunks of 16 (the activations
#: in L1, the weights read again per chunk: 32 times from memory): 1.16x and 1.11x on one thread,
#: 1.30x and 1.38x on two, which share the memory bus and L3. Longer steps read the weights once
#: per chunk of this many rows
CHUNK_ROWS = 512


#: the int8 kernels' forms as :func:`int8_matmul` takes them (one integer: the form, and for ``"q8a"``
#: and ``"q4h"`` the block and variant the row dot products are compiled for)
FORM_Q4, FORM_Q4K, FORM_Q8, FORM_Q8A, FORM_Q8A16, FORM_Q5_0, FORM_Q6_K, FORM_Q3_K = range(8)
_PLANE_FORM = {"Q5_0": FORM_Q5_0, "Q6_K": FORM_Q6_K, "Q3_K": FORM_Q3_K}

#: placeholders for the arrays a form has none of (one array type per argument: one compilation)
_NO_PLANES = np.zeros((1, 32), np.uint8)  # Q3_K's codes fit their nibbles; no plane words elsewhere
_NO_SCALES = np.zeros((1, 8), np.uint8)  # integer sub-block scales: Q4_K's and the K-quant planes' only


@njit(cache=True, inline="always")
def _rows(form, tile, qs, d, m, qh, sc, mn, xq, xd, xs, xsum, out, g, t):
    """Group ``g`` of the weight rows against activation rows ``t .. t + X_ROWS - 1`` (``tile``: the
    activation arrays tile-major, :func:`_tile_major`) or ``t`` alone (row-major), by ``form``: the
    form's row dot products."""
    if form == FORM_Q4:
        if tile:
            q4_rows_dot_tile(qs, d, m, xq, xd, xs, out, g, t)
        else:
            q4_rows_dot(qs, d, m, xq, xd, xs, out, g, t)
    elif form == FORM_Q4K:
        if tile:
            q4k_rows_dot_tile(qs, d, m, sc, mn, xq, xd, xsum, out, g, t)
        else:
            q4k_rows_dot(qs, d, m, sc, mn, xq, xd, xsum, out, g, t)
    elif form == FORM_Q8:
        if tile:
            q8_rows_dot_tile(qs, d, xq, xd, out, g, t)
        else:
            q8_rows_dot(qs, d, xq, xd, out, g, t)
    elif form == FORM_Q8A:
        if tile:
            q8a_rows_dot_tile(qs, d, m, xq, xd, xs, out, g, t)
        else:
            q8a_rows_dot(qs, d, m, xq, xd, xs, out, g, t)
    elif form == FORM_Q8A16:
        if tile:
            q8a_16_rows_dot_tile(qs, d, m, xq, xd, xs, out, g, t)
        else:
            q8a_16_rows_dot(qs, d, m, xq, xd, xs, out, g, t)
    elif form == FORM_Q5_0:
        if tile:
            q5_0_rows_dot_tile(qs, qh, d, sc, xq, xd, xsum, out, g, t)
        else:
            q5_0_rows_dot(qs, qh, d, sc, xq, xd, xsum, out, g, t)
    elif form == FORM_Q6_K:
        if tile:
            q6_k_rows_dot_tile(qs, qh, d, sc, xq, xd, xsum, out, g, t)
        else:
            q6_k_rows_dot(qs, qh, d, sc, xq, xd, xsum, out, g, t)
    elif tile:
        q3_k_rows_dot_tile(qs, qh, d, sc, xq, xd, xsum, out, g, t)
    else:
        q3_k_rows_dot(qs, qh, d, sc, xq, xd, xsum, out, g, t)


#: the bias of each form's codes, by ``FORM_*`` (:data:`PLANE_FORMS`; 0 where a form has none)
_BIAS_BY_FORM = (0, 1, 0, 0, 0, PLANE_FORMS["Q5_0"][1], PLANE_FORMS["Q6_K"][1], PLANE_FORMS["Q3_K"][1])


@njit(cache=True, inline="always")
def _code_sum(xq, t, start, stop):
    total = np.int32(0)  # int32 lanes: twice as many to a vector as the default int64's
    for j in range(start, stop):
        total += np.int32(xq[t, j])
    return total


@njit(cache=True)
def _code_sums_serial(bias, xq, xsum):
    block = xq.shape[1] // xsum.shape[1]
    for t in range(xsum.shape[0]):
        for b in range(xsum.shape[1]):
            xsum[t, b] = bias * _code_sum(xq, t, b * block, (b + 1) * block)


@njit(parallel=True, cache=True)
def _code_sums_parallel(bias, xq, xsum):
    block = xq.shape[1] // xsum.shape[1]
    for t in prange(xsum.shape[0]):
        for b in range(xsum.shape[1]):
            xsum[t, b] = bias * _code_sum(xq, t, b * block, (b + 1) * block)


@njit(cache=True)
def _code_sums(form, xq, xd):
    """``[T, cols / block]`` int32: each activation block's code sum times the form's bias (Q4_K's: 1),
    which the ``"q4h"`` forms subtract from their integer dot products (exact) and Q4_K's minimums
    multiply; ``[0, 0]`` for the other forms. On the threads from :data:`PARALLEL_QUANTIZE_ROWS` rows."""
    bias = _BIAS_BY_FORM[form]
    if bias == 0:
        return np.zeros((0, 0), np.int32)
    xsum = np.empty(xd.shape, np.int32)
    if xq.shape[0] >= PARALLEL_QUANTIZE_ROWS:
        _code_sums_parallel(bias, xq, xsum)
    else:
        _code_sums_serial(bias, xq, xsum)
    return xsum


@njit(parallel=True, cache=True)
def _tile_major(a):
    """``a [T, n]`` -> ``[T // X_ROWS, n * X_ROWS]``: each tile of :data:`X_ROWS` rows with its rows side by
    side, row ``j``'s element ``c`` at ``c * X_ROWS + j`` (the tile kernels' layout, see ``_Activations``);
    the rows after the last whole tile left out (the one-row kernels take those from ``a``). A tile per
    thread: at two threads, serial copies were a twentieth of a 512-token prompt's products."""
    tiles, n = a.shape[0] // X_ROWS, a.shape[1]
    out = np.empty((tiles, n * X_ROWS), a.dtype)
    for i in prange(tiles):
        for j in range(X_ROWS):
            for c in range(n):
                out[i, c * X_ROWS + j] = a[i * X_ROWS + j, c]
    return out


@njit(parallel=True, cache=True)
def int8_matmul(form, qs, d, m, qh, sc, mn, xq, xd, xs):
    """``[T, groups * GROUP_ROWS]``: every row of an int8 copy (:attr:`Int8Rows.kernel_args`: its
    ``form`` and arrays) against every row of activations quantised for it.

    The work is cut into (chunk of :data:`CHUNK_ROWS` activation rows, group of weight rows)
    pieces, split across threads; a piece takes its group against the chunk's activation
    rows a tile at a time (:data:`X_ROWS`: each loaded weight word serves the whole tile), then
    the rest one by one, so the group's bytes come from memory once per chunk and from L1 for
    the other rows, and the chunk's activations from L2/L3. Which row dot products a piece
    runs is the form's (:func:`_rows`).

    One kernel for every form, the form a value: a copy of it per form (the form a constant to
    LLVM) measured the same at T = 512 on Llama-1B's Q4_K and Q6_K matrices, once the integer
    scales and tile-major activations were in; and made as closures sharing one code object with
    the form an omitted argument, all but the first such copy missed Numba's C dispatch and went
    through its Python path, 80 µs a call.
    """
    groups, t_count = qs.shape[0], xq.shape[0]
    out = np.empty((t_count, groups * GROUP_ROWS), np.float32)
    xsum = _code_sums(form, xq, xd)
    # the tiles' copies of the activations (tile-major); with no whole tile, the arrays themselves
    # stand in, unread (no allocation in a decode step)
    xq_words = xq.view(np.int32)
    xq_tiles, xd_tiles, xs_tiles, xsum_tiles = xq_words, xd, xs, xsum
    if t_count >= X_ROWS:
        xq_tiles, xd_tiles = _tile_major(xq_words), _tile_major(xd)
        if _BIAS_BY_FORM[form] == 0:
            xs_tiles = _tile_major(xs)
        else:
            xsum_tiles = _tile_major(xsum)
    chunks = (t_count + CHUNK_ROWS - 1) // CHUNK_ROWS
    for piece in prange(chunks * groups):
        chunk, g = piece // groups, piece % groups
        t, stop = chunk * CHUNK_ROWS, min(t_count, (chunk + 1) * CHUNK_ROWS)
        while t + X_ROWS <= stop:
            _rows(form, True, qs, d, m, qh, sc, mn, xq_tiles, xd_tiles, xs_tiles, xsum_tiles, out, g, t)
            t += X_ROWS
        while t < stop:
            _rows(form, False, qs, d, m, qh, sc, mn, xq, xd, xs, xsum, out, g, t)
            t += 1
    return out


def matmul_int8(x: np.ndarray, w: Int8Rows) -> np.ndarray:
    """``x [T, cols] @ W.T -> [T, rows]`` float32 through 8-bit activations (the weight type's
    scheme, rounded as llama.cpp rounds them: :mod:`.activations`) and integer dot products.

    Call only where :func:`int8_unavailable` is None (the kernels are AVX2 code).
    """
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim != 2 or x.shape[1] != w.cols:
        raise ValueError(f"matmul_int8: x has shape {x.shape}, the weight expects [T, {w.cols}]")
    return products(w, *quantize_activations(x, w.scheme, w.block))


def products(w: Int8Rows, xq: np.ndarray, xd: np.ndarray, xs: np.ndarray) -> np.ndarray:
    """``[T, rows]``: the kernel of ``w``'s form on activations quantised already (``xq`` int8 ``[T, cols]``,
    ``xd``, ``xs`` float32 ``[T, cols / w.block]``, as :func:`.activations.quantize_activations` gives them)."""
    form, *arrays = w.kernel_args
    out = int8_matmul(form, *arrays, xq, xd, xs)
    return out if out.shape[1] == w.rows else out[:, : w.rows]


__all__ = ["GROUP_ROWS", "X_ROWS", "Int8Rows", "int8_instructions", "int8_matmul", "int8_rows",
           "int8_rows_from_blocks", "int8_rows_planes", "int8_rows_q4_k", "int8_rows_q4_k_parts", "int8_rows_unsigned", "int8_unavailable", "matmul_int8", "products",
           "quantize_q8_1"]
