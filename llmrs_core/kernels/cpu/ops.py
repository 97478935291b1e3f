"""The small operations of a decode step as Numba kernels (chapter 8, section 8.4).

At one token per step the matrix products are only part of the time: a
NumPy expression such as RMSNorm makes several temporary arrays and several
passes over ``x``, each with its own Python call. These kernels do each
operation in one pass with no temporaries. They compute the same functions
as ``llmrs_core.layers``, ``rope`` and ``attention`` (the references they
are tested against), in float32, to its rounding.

None is compiled with ``fastmath`` (see :data:`LANES`): each one's bits are fixed by its code,
whoever calls it and whatever the CPU. Sums are written in an order the code names: RMSNorm's and the
softmax's in 8 lanes, attention's scores each in order, several side by side. ``exp`` is :func:`exp32`,
float32 arithmetic of this file's own, not the C library's.
"""

from __future__ import annotations

import math

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

#: the kernels below are compiled without ``fastmath``: every sum runs in an order the code fixes, and no
#: multiply and add are fused, so a kernel computes the same bits in any caller (the layer loop's Python,
#: or :mod:`.decode`'s compiled step, where LLVM optimises its copy in another context) and on any CPU.
#: The int8 path's batch invariance needs the first: a token's numbers must not depend on the step.
LANES = 8


@njit(cache=True, inline="always")
def _tree(lanes):
    """``lanes [8]`` added in a fixed tree: ``((0 + 1) + (2 + 3)) + ((4 + 5) + (6 + 7))``."""
    return ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]))


@intrinsic
def _float_from_bits(typingctx, bits):
    """The float32 whose IEEE bits are the low 32 bits of the integer ``bits`` (LLVM's ``bitcast``; no
    Numba function does it for a scalar, and LLVM vectorises a loop around it). In this file: Numba's
    on-disk cache of a kernel notices changes to the kernel's own file only."""
    if not isinstance(bits, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        low = args[0] if bits.bitwidth == 32 else builder.trunc(args[0], ir.IntType(32))
        return builder.bitcast(low, ir.FloatType())

    return types.float32(bits), codegen


_F32 = ir.FloatType()
_V8F = ir.VectorType(_F32, 8)


def _weighted_block(builder, weights, count, rows, stride, outs, j0, vectors: int, lanes: int) -> None:
    """The IR of ``outs[r][j0 + j] += weights[r][i] * rows[i * stride + j0 + j]`` for ``i`` in ``0 .. count - 1``,
    in that order, for each row ``r`` and ``j`` below ``vectors * lanes``: the block's sums stay in
    registers (``vectors`` of ``lanes`` floats per row: independent chains) across all ``i``; each term
    of ``rows`` is loaded once for all rows, and is a product then a sum (no fused multiply-add)."""
    vtype = _V8F if lanes == 8 else _F32
    intp = j0.type

    def at(base, index):
        ptr = builder.gep(base, [index])
        return builder.bitcast(ptr, vtype.as_pointer()) if lanes == 8 else ptr

    def offset(k):
        return builder.add(j0, ir.Constant(intp, k * lanes))

    accs = [[cgutils.alloca_once(builder, vtype) for _ in range(vectors)] for _ in outs]
    for o, row_accs in zip(outs, accs):
        for k, acc in enumerate(row_accs):
            builder.store(builder.load(at(o, offset(k)), align=4), acc)
    with cgutils.for_range(builder, count) as terms:
        row = builder.gep(rows, [builder.mul(terms.index, stride)])
        values = [builder.load(at(row, offset(k)), align=4) for k in range(vectors)]
        for w, row_accs in zip(weights, accs):
            weight = builder.load(builder.gep(w, [terms.index]))
            if lanes == 8:
                lane0 = builder.insert_element(ir.Constant(_V8F, ir.Undefined), weight, ir.Constant(ir.IntType(32), 0))
                weight = builder.shuffle_vector(lane0, ir.Constant(_V8F, ir.Undefined),
                                                ir.Constant(ir.VectorType(ir.IntType(32), 8), [0] * 8))
            for value, acc in zip(values, row_accs):
                builder.store(builder.fadd(builder.load(acc), builder.fmul(weight, value)), acc)
    for o, row_accs in zip(outs, accs):
        for k, acc in enumerate(row_accs):
            builder.store(builder.load(acc), at(o, offset(k)), align=4)


#: the outputs kept in registers across all terms at once: eight vectors of eight, all of a 64-wide
#: head's row (AVX2's sixteen registers hold them and a term), shared among the rows taken together.
#: Measured on Llama-1B's 512-token attention (32 heads of 64), one thread: 47 -> 35 ms a layer with
#: the weighted sum of values through here; 128-wide heads (two blocks) 41 ms either way. 32 floats
#: left a 64-wide row in two passes; 128 spilled
ROW_BLOCK = 64


def _weighted_rows_intrinsic(n_rows: int):
    """:func:`_add_weighted_rows` for ``n_rows`` rows of weights (and of outputs) at once."""

    def typer(typingctx, w, w_at, w_stride, m, start, stride, count, width, out, at, out_stride):
        if not all(isinstance(a, types.Array) and a.dtype == types.float32 and a.layout == "C" for a in (w, m, out)):
            return None
        return types.void(w, w_at, w_stride, m, start, stride, count, width, out, at, out_stride), codegen

    def codegen(context, builder, signature, args):
        w_a, m_a, out_a = (context.make_array(signature.args[i])(context, builder, args[i]) for i in (0, 3, 8))
        w_at, w_stride, start, stride, count, width, at, out_stride = (
            context.cast(builder, args[i], signature.args[i], types.intp) for i in (1, 2, 4, 5, 6, 7, 9, 10))
        intp = at.type

        def const(value):
            return ir.Constant(intp, value)

        weights = [builder.gep(w_a.data, [builder.add(w_at, builder.mul(w_stride, const(r)))]) for r in range(n_rows)]
        outs = [builder.gep(out_a.data, [builder.add(at, builder.mul(out_stride, const(r)))]) for r in range(n_rows)]
        rows = builder.gep(m_a.data, [start])
        block = ROW_BLOCK // n_rows
        wide = builder.udiv(width, const(block))
        with cgutils.for_range(builder, wide) as blocks:
            _weighted_block(builder, weights, count, rows, stride, outs, builder.mul(blocks.index, const(block)),
                            block // 8, 8)
        done = builder.mul(wide, const(block))
        eights = builder.udiv(builder.sub(width, done), const(8))
        with cgutils.for_range(builder, eights) as blocks:
            _weighted_block(builder, weights, count, rows, stride, outs,
                            builder.add(done, builder.mul(blocks.index, const(8))), 1, 8)
        done = builder.add(done, builder.mul(eights, const(8)))
        with cgutils.for_range(builder, builder.sub(width, done)) as rest:
            _weighted_block(builder, weights, count, rows, stride, outs, builder.add(done, rest.index), 1, 1)
        return context.get_dummy_value()

    typer.__name__ = f"weighted_rows_{n_rows}"
    return intrinsic(typer)


_add_weighted_rows = _weighted_rows_intrinsic(1)
_add_weighted_rows.__doc__ = """``out.flat[at + r out_stride + j] += sum_i w.flat[w_at + r w_stride + i] m.flat[start + i stride + j]``
    for ``j < width``, ``i < count`` and each row ``r`` (here one; :data:`_add_weighted_rows_4`: four;
    float32 C-contiguous arrays), each sum over ``i`` in order, a product then a sum per term: the
    bits of ``for i: for j: o[j] = o[j] + w[i] * m[i, j]``. Attention's weighted sum of values is this
    (``w`` the weights, ``m`` the values, ``j`` over ``e``, ``i`` over keys), and so are its scores
    from the keys transposed (``w`` a query, ``m`` the keys, ``j`` over keys, ``i`` over ``e``).

    Written as IR because that loop nest, however ordered in Numba, left the output in memory: a
    load and a store of each ``o[j]`` per pass over the terms. Here the output is taken
    :data:`ROW_BLOCK` floats at a time (shared among the rows), held in registers across all
    ``count`` terms (independent chains of eight lanes), then the rest eight and one at a time; each
    ``m`` term is loaded once for all rows. The block sizes change no bits: each ``j`` is summed on its own."""
#: four rows at once: four queries' scores against the same keys
_add_weighted_rows_4 = _weighted_rows_intrinsic(4)


_EXP_HI = np.float32(88.72283)  # the clamp above; from 127.5 ln 2 = 88.38 on, 2**n is 2**128 = inf: +inf
_EXP_LO = np.float32(-87.33654)  # ln of float32's smallest normal; below: 0
_LOG2E = np.float32(1.442695040888963)
_ROUNDER = np.float32(12582912.0)  # 1.5 * 2**23: (y + it) - it rounds y (|y| < 2**22) to an integer
_LN2_HI = np.float32(0.693359375)  # ln 2 in two parts (Cody and Waite): n * _LN2_HI is exact for |n| < 2**9
_LN2_LO = np.float32(-2.12194440e-4)
# exp(r) - 1 - r over r**2 for |r| <= ln(2) / 2, Horner's coefficients (Cephes' expf)
_EXP_POLY = (np.float32(1.9875691500e-4), np.float32(1.3981999507e-3), np.float32(8.3334519073e-3),
             np.float32(4.1665795894e-2), np.float32(1.6666665459e-1), np.float32(5.0000001201e-1))


@njit(cache=True, inline="always", error_model="numpy")
def exp32(x):
    """``exp(x)`` of a float32 within 1 unit in the last place (Cephes' ``expf``; 0.98 at worst over
    [-87.3, 88.3]), in float32 operations a loop vectorises: ``x = n ln 2 + r``, ``exp(r)`` a
    polynomial, ``2**n`` built from its bits. Not ``np.exp``: Numba calls the C library's scalar
    ``expf`` for that, a call per value (3.7 ns against 0.44; SwiGLU and the attention, which call it,
    were 22% of Llama-1B's 512-token prompt on one thread). Its bits are the code's on any CPU: no fused
    multiply-adds (no ``fastmath``), no table. NaN stays NaN; +inf above :data:`_EXP_HI`, 0 below
    :data:`_EXP_LO` (float32's ``exp`` is subnormal there)."""
    xc = _EXP_HI if x > _EXP_HI else x
    xc = _EXP_LO if xc < _EXP_LO else xc
    n = (xc * _LOG2E + _ROUNDER) - _ROUNDER
    r = (xc - n * _LN2_HI) - n * _LN2_LO
    p = _EXP_POLY[0]
    p = p * r + _EXP_POLY[1]
    p = p * r + _EXP_POLY[2]
    p = p * r + _EXP_POLY[3]
    p = p * r + _EXP_POLY[4]
    p = p * r + _EXP_POLY[5]
    y = ((p * r) * r + r) + np.float32(1)
    y = y * _float_from_bits((np.int32(n) + 127) << 23)
    return np.float32(0) if x < _EXP_LO else y


@njit(cache=True, inline="always")
def _lane_sum(a, n):
    """``a[0] + ... + a[n - 1]`` in :data:`LANES` lanes (``i % 8``), then :func:`_tree`'s order, then the tail."""
    l0 = l1 = l2 = l3 = l4 = l5 = l6 = l7 = np.float32(0)
    full = n - n % LANES
    for i in range(0, full, LANES):
        l0 += a[i]
        l1 += a[i + 1]
        l2 += a[i + 2]
        l3 += a[i + 3]
        l4 += a[i + 4]
        l5 += a[i + 5]
        l6 += a[i + 6]
        l7 += a[i + 7]
    total = ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7))
    for i in range(full, n):
        total += a[i]
    return total


# error_model="numpy": a division by zero gives inf/NaN (caught once per step by the model,
# with a message that blames the weights) instead of Numba's ZeroDivisionError from a kernel.
@njit(cache=True, error_model="numpy")
def rms_norm(x, weight, eps):
    """``x [T, d]`` -> ``x / sqrt(mean(x**2) + eps) * weight``, float32. The sum of squares in
    :data:`LANES` lanes (``i % 8``), then :func:`_tree`, then the tail: an order any CPU can keep (LLVM
    leaves these adds scalar here; a prompt's 512 rows take 150 µs against 58 with ``fastmath``)."""
    t_count, dim = x.shape
    out = np.empty((t_count, dim), np.float32)
    lanes = np.empty(LANES, np.float32)
    full = dim - dim % LANES
    for t in range(t_count):
        lanes[:] = 0
        for i in range(0, full, LANES):
            for j in range(LANES):
                lanes[j] += x[t, i + j] * x[t, i + j]
        ss = _tree(lanes)
        for i in range(full, dim):
            ss += x[t, i] * x[t, i]
        inv = np.float32(1) / np.sqrt(ss / np.float32(dim) + np.float32(eps))
        for i in range(dim):
            out[t, i] = x[t, i] * inv * weight[i]
    return out


@njit(cache=True)
def rope_tables(positions, freqs):
    """``cos, sin`` ``[T, D/2]`` float32 of ``position * freq``, the angles formed in float64."""
    t_count, half = positions.shape[0], freqs.shape[0]
    cos = np.empty((t_count, half), np.float32)
    sin = np.empty((t_count, half), np.float32)
    for t in range(t_count):
        for i in range(half):
            a = np.float64(positions[t]) * freqs[i]
            cos[t, i] = np.float32(math.cos(a))
            sin[t, i] = np.float32(math.sin(a))
    return cos, sin


@njit(cache=True)
def rope(x, cos, sin, interleaved):
    """Rotate ``x [T, H, D]`` by the tables of :func:`rope_tables`: pairs ``(2i, 2i+1)``
    when ``interleaved`` (GGUF), else ``(i, i + D/2)`` (Hugging Face). Returns a new array."""
    t_count, heads, dim = x.shape
    half = dim // 2
    out = np.empty((t_count, heads, dim), np.float32)
    for t in range(t_count):
        for h in range(heads):
            for i in range(half):
                if interleaved:
                    a, b = 2 * i, 2 * i + 1
                else:
                    a, b = i, i + half
                e, o = x[t, h, a], x[t, h, b]
                out[t, h, a] = e * cos[t, i] - o * sin[t, i]
                out[t, h, b] = e * sin[t, i] + o * cos[t, i]
    return out


@njit(parallel=True, cache=True, error_model="numpy")
def swiglu(gate, up):
    """``silu(gate) * up`` for ``gate, up [T, ff]`` -> ``[T, ff]`` float32, ``silu(g) = g / (1 + exp(-g))``
    (a very negative ``g`` gives ``exp = inf`` and ``-0.0``: no overflow error; ``exp`` is :func:`exp32`,
    vectorised). Rows in parallel.
    Faster than NumPy's tanh form (``layers.swiglu``) from a few rows on: no temporaries."""
    t_count, width = gate.shape
    out = np.empty((t_count, width), np.float32)
    for t in prange(t_count):
        # a row of each into contiguous scratch first: ``gate`` and ``up`` are often the two halves of one
        # fused product (strided views), and LLVM vectorises the arithmetic only over contiguous rows.
        # Llama-1B's 512 x 8192, one thread: 22 ms on the views as they are, 6.7 ms with these copies;
        # copying both halves into new arrays in NumPy first cost about 25 ms a layer
        g_row, u_row = np.empty(width, np.float32), np.empty(width, np.float32)
        for i in range(width):
            g_row[i], u_row[i] = gate[t, i], up[t, i]
        for i in range(width):
            g = g_row[i]
            out[t, i] = g / (np.float32(1) + exp32(-g)) * u_row[i]
    return out


#: the attention kernels' options switched off, ``window, softcap, scale`` (Llama's attention). The
#: kernels take them explicitly, never as defaults: an omitted argument is a compile-time constant
#: to Numba, and a second specialisation folded around it need not round as the engine's does.
NO_OPTIONS = (0, np.float32(0), np.float32(0))


#: queries whose scores :func:`attention` sums together in a prompt (each key loaded once for all)
QUERY_TILE = 4


#: from this many queries on, :func:`attention` transposes the keys once (``[Hkv, D, Tk]``) and each
#: pair sums its scores with SIMD across keys; fewer (a decode step's one) read the keys in place,
#: eight at a time. Both sum each score in the order ``e = 0, 1, ..., D - 1``, so they give the same
#: bits: a prompt's query and a decode step's agree.
TRANSPOSE_QUERIES = 8


@njit(cache=True, error_model="numpy")
def _scores_in_place(q, t, h, k, kh, first, limit, scores):
    """``scores[s - first] = q[t, h] . k[s, kh]`` for ``s`` in ``[first, limit)`` (``k [Tk, Hkv, D]``), each
    summed in order over ``e``; eight keys at a time, so that eight sums are in flight at once."""
    dim = q.shape[2]
    qv = q[t, h]
    s = first
    while s + 8 <= limit:
        k0, k1, k2, k3 = k[s, kh], k[s + 1, kh], k[s + 2, kh], k[s + 3, kh]
        k4, k5, k6, k7 = k[s + 4, kh], k[s + 5, kh], k[s + 6, kh], k[s + 7, kh]
        a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = np.float32(0)
        for e in range(dim):
            qe = qv[e]
            a0 += qe * k0[e]
            a1 += qe * k1[e]
            a2 += qe * k2[e]
            a3 += qe * k3[e]
            a4 += qe * k4[e]
            a5 += qe * k5[e]
            a6 += qe * k6[e]
            a7 += qe * k7[e]
        j = s - first
        scores[j], scores[j + 1], scores[j + 2], scores[j + 3] = a0, a1, a2, a3
        scores[j + 4], scores[j + 5], scores[j + 6], scores[j + 7] = a4, a5, a6, a7
        s += 8
    while s < limit:
        kr = k[s, kh]
        acc = np.float32(0)
        for e in range(dim):
            acc += qv[e] * kr[e]
        scores[s - first] = acc
        s += 1


@njit(cache=True, error_model="numpy")
def _scores_transposed(q, t, h, kt, kh, first, limit, scores):
    """:func:`_scores_in_place`'s numbers from the keys transposed (``kt [Hkv, D, Tk]``): the loop over
    keys is the inner one, so SIMD runs across keys and each score is still summed in order."""
    dim = q.shape[2]
    n = limit - first
    scores[:n] = 0
    e = 0
    while e + 4 <= dim:  # four terms per pass over the scores, added in order: one load and store, not four
        q0, q1, q2, q3 = q[t, h, e], q[t, h, e + 1], q[t, h, e + 2], q[t, h, e + 3]
        k0, k1 = kt[kh, e, first:limit], kt[kh, e + 1, first:limit]
        k2, k3 = kt[kh, e + 2, first:limit], kt[kh, e + 3, first:limit]
        for s in range(n):
            scores[s] = (((scores[s] + q0 * k0[s]) + q1 * k1[s]) + q2 * k2[s]) + q3 * k3[s]
        e += 4
    while e < dim:
        qe = q[t, h, e]
        keys = kt[kh, e, first:limit]
        for s in range(n):
            scores[s] += qe * keys[s]
        e += 1


@njit(cache=True, error_model="numpy")
def _softmax_weights(scores, n, dim, softcap, scale):
    """``scores[:n]`` (``q . k``) into the softmax's weights, in place: scaled (``scale`` > 0, else
    ``1 / sqrt(dim)``), soft-capped (``softcap`` > 0: ``softcap * tanh(s / softcap)``), ``exp``
    (:func:`exp32`) of each less the largest, divided by their sum in :func:`_lane_sum`'s order
    (multiplied by its inverse)."""
    if scale <= 0:
        scale = np.float32(1.0 / math.sqrt(dim))
    for s in range(n):
        acc = scores[s] * scale
        if softcap > 0:
            acc = softcap * np.tanh(acc / softcap)
        scores[s] = acc
    best = np.float32(-np.inf)  # a maximum is the same in any order: no fixed lanes needed
    for s in range(n):
        best = max(best, scores[s])
    for s in range(n):  # vectorised (exp32)
        scores[s] = exp32(scores[s] - best)
    inv = np.float32(1) / _lane_sum(scores, n)
    for s in range(n):
        scores[s] = scores[s] * inv


@njit(cache=True, error_model="numpy")
def _weigh(scores, n, v, kh, first, out, t, h, softcap, scale):
    """From ``scores[:n]`` (``q . k`` of keys ``first ..``): the softmax's weights (:func:`_softmax_weights`)
    and the weighted sum of ``v[first:first + n, kh]`` (``v [Tk, Hkv, D]``, C-contiguous) added to
    ``out[t, h]``, key by key in order (:func:`_add_weighted_rows`)."""
    dim = out.shape[2]
    _softmax_weights(scores, n, dim, softcap, scale)
    hkv = v.shape[1]  # v [Tk, Hkv, D]: key first + s of head kh at ((first + s) Hkv + kh) D
    _add_weighted_rows(scores, 0, 0, v, (first * hkv + kh) * dim, hkv * dim, n, dim, out, (t * out.shape[1] + h) * dim, 0)


@njit(cache=True, inline="always")
def _folded(i, n):
    """The ``i``-th of ``0 .. n - 1`` taken from both ends in turn: 0, n - 1, 1, n - 2, ...

    A causal query's work grows with its position, and Numba's ``prange`` gives each thread an equal
    run of iterations: in order, two threads got a quarter and three quarters of a prompt's attention
    (measured on Llama-1B at 512 tokens: two threads 1.28x one). Folded, every run of iterations holds
    early and late queries alike."""
    return i // 2 if i % 2 == 0 else n - 1 - i // 2


@njit(parallel=True, cache=True, error_model="numpy")  # see rms_norm
def attention(q, k, v, window, softcap, scale):
    """Causal GQA attention: ``q [Tq, Hq, D]``, ``k, v [Tk, Hkv, D]`` -> ``[Tq, Hq, D]``.
    ``window``, ``softcap``, ``scale``: a family's options, 0 is off (``attention.AttentionOptions``):
    ``window`` > 0 hides keys ``window`` or more positions back; ``softcap``, ``scale``: see :func:`_weigh`.

    The queries are the last ``Tq`` of the ``Tk`` positions (query ``t`` sees
    keys ``0 .. Tk - Tq + t``). One pass per (query, head) pair: scores,
    softmax, weighted sum of values, touching only the keys the query may
    see — half the work of a masked ``[Tq, Tk]`` product in prefill, and no
    ``[Hq, Tq, Tk]`` temporary. The pairs run in parallel, the queries in :func:`_folded` order; from
    :data:`TRANSPOSE_QUERIES` queries on, over keys transposed and values made head-major once.
    """
    tq, hq, dim = q.shape
    tk, hkv = k.shape[0], k.shape[1]
    group = hq // hkv
    q = np.ascontiguousarray(q)  # the four-query tiles read it through _add_weighted_rows_4 (no copy if it is)
    transposed = tq >= TRANSPOSE_QUERIES
    kt = np.empty((hkv, dim, tk if transposed else 0), np.float32)
    # a prompt's values head-major, [Hkv * Tk, 1, D]: key s of head kh is row kh * Tk + s, so a head's
    # rows are adjacent (in [Tk, Hkv, D] they are Hkv * D floats apart: a 4 KB page a key at 8 heads of
    # 128). Measured on 512 tokens, one thread: heads of 128 40 -> 35 ms a layer, of 64 34 -> 32.
    # A few queries read the values where they are (a decode step would copy the whole cache)
    if transposed:
        vh = np.empty((hkv * tk, 1, dim), np.float32)
        for row in prange(hkv * tk):
            kh, s = row // tk, row % tk
            for e in range(dim):
                vh[row, 0, e] = v[s, kh, e]
        for row in prange(hkv * dim):
            kh, e = row // dim, row % dim
            for s in range(tk):
                kt[kh, e, s] = k[s, kh, e]
    else:
        vh = np.ascontiguousarray(v)  # _add_weighted_rows reads rows of a C-contiguous array
    out = np.zeros((tq, hq, dim), np.float32)
    # a prompt's queries four at a time (without a window: all four see keys 0 ..): their scores in one
    # pass over the keys, each key loaded once for the four (_add_weighted_rows_4), each score the
    # same sum in the same order as alone. The queries after the last whole tile go one by one
    tiles = tq // QUERY_TILE if transposed and window <= 0 else 0
    for unit in prange(tiles * hq):
        t0, h = _folded(unit // hq, tiles) * QUERY_TILE, unit % hq
        kh = h // group
        n_max = tk - tq + t0 + QUERY_TILE  # the tile's last query sees this many keys
        scores = np.zeros((QUERY_TILE, n_max), np.float32)
        _add_weighted_rows_4(q, (t0 * hq + h) * dim, hq * dim, kt, kh * dim * tk, tk, dim, n_max, scores, 0, n_max)
        n_min = n_max - QUERY_TILE + 1  # the tile's first query sees this many
        for r in range(QUERY_TILE):
            _softmax_weights(scores[r], n_min + r, dim, softcap, scale)
        # the values: keys 0 .. n_min - 1 for the four together (each value row loaded once), then each
        # query's own last keys, continuing its sums in the same order
        at = (t0 * hq + h) * dim
        _add_weighted_rows_4(scores, 0, n_max, vh, kh * tk * dim, dim, n_min, dim, out, at, hq * dim)
        for r in range(1, QUERY_TILE):
            _add_weighted_rows(scores, r * n_max + n_min, 0, vh, (kh * tk + n_min) * dim, dim, r, dim, out,
                               at + r * hq * dim, 0)
    done = tiles * QUERY_TILE
    for pair in prange((tq - done) * hq):
        t, h = done + _folded(pair // hq, tq - done), pair % hq
        limit = tk - tq + t + 1
        first = max(0, limit - window) if window > 0 else 0
        scores = np.empty(limit - first, np.float32)
        if transposed:
            _scores_transposed(q, t, h, kt, h // group, first, limit, scores)
        else:
            _scores_in_place(q, t, h, k, h // group, first, limit, scores)
        if transposed:
            _weigh(scores, limit - first, vh, 0, (h // group) * tk + first, out, t, h, softcap, scale)
        else:
            _weigh(scores, limit - first, vh, h // group, first, out, t, h, softcap, scale)
    return out


@njit(parallel=True, cache=True, error_model="numpy")
def paged_decode_attention(q, k_pool, v_pool, tables, lengths, window, softcap, scale):
    """One decode token per sequence, its keys and values read from a block pool in place:
    ``q [n, Hq, D]``, ``k_pool, v_pool [num_blocks, Hkv, block_size, D]`` (one layer's),
    ``tables`` int64 ``[n, max blocks]``, ``lengths`` int64 ``[n]`` -> ``[n, Hq, D]``.

    One parallel loop over (sequence, KV head) pairs for the whole batch, instead of a
    gather and a kernel call per sequence from Python: each pair copies its head's keys and
    values into a contiguous scratch (``[length, 1, D]``, in L1/L2) and its query heads attend
    there through :func:`_scores_in_place` and :func:`_weigh`, as :func:`attention` does, so a
    sequence's numbers are the contiguous cache's.
    """
    n, hq, dim = q.shape
    hkv, block_size = k_pool.shape[1], k_pool.shape[2]
    group = hq // hkv
    out = np.zeros((n, hq, dim), np.float32)
    for pair in prange(n * hkv):
        i, kh = pair // hkv, pair % hkv
        length = lengths[i]
        k = np.empty((length, 1, dim), np.float32)
        v = np.empty((length, 1, dim), np.float32)
        for s in range(length):
            block, slot = tables[i, s // block_size], s % block_size
            for e in range(dim):
                k[s, 0, e] = k_pool[block, kh, slot, e]
                v[s, 0, e] = v_pool[block, kh, slot, e]
        first = max(0, length - window) if window > 0 else 0
        scores = np.empty(length - first, np.float32)
        for h in range(kh * group, (kh + 1) * group):
            _scores_in_place(q, i, h, k, 0, first, length, scores)
            _weigh(scores, length - first, v, 0, first, out, i, h, softcap, scale)
    return out


def attention_prefill(q: np.ndarray, k: np.ndarray, v: np.ndarray, chunk: int = 128) -> np.ndarray:
    """Causal GQA attention for many queries, through BLAS: same arguments and result as :func:`attention`.

    For a long prompt the score and value products are real matrix products,
    and sgemm does them several times faster than a Numba loop (the ``exp``
    of the softmax is vectorised in NumPy and not in Numba). The queries go
    in chunks of ``chunk``; chunk ``[c0, c1)`` multiplies only the keys it
    may see, ``0 .. Tk - Tq + c1``, and masks only its last ``c1 - c0``
    columns — about 5/8 of a full ``[Tq, Tk]`` product at 4 chunks.
    """
    tq, hq, dim = q.shape
    tk, hkv = k.shape[0], k.shape[1]
    group = hq // hkv
    offset = tk - tq
    qg = q.reshape(tq, hkv, group, dim).transpose(1, 2, 0, 3) * np.float32(1.0 / math.sqrt(dim))
    kt = k.transpose(1, 2, 0)[:, None]  # [Hkv, 1, D, Tk]
    vt = v.transpose(1, 0, 2)[:, None]  # [Hkv, 1, Tk, D]
    out = np.empty((hkv, group, tq, dim), np.float32)
    for c0 in range(0, tq, chunk):
        c1 = min(c0 + chunk, tq)
        end = offset + c1
        scores = qg[:, :, c0:c1] @ kt[..., :end]  # [Hkv, group, c, end]
        upper = np.triu(np.ones((c1 - c0, c1 - c0), dtype=bool), 1)  # key after query: hidden
        scores[..., offset + c0:end][..., upper] = -np.inf
        scores -= scores.max(axis=-1, keepdims=True)
        np.exp(scores, out=scores)
        scores /= scores.sum(axis=-1, keepdims=True)
        out[:, :, c0:c1] = scores @ vt[..., :end, :]
    return out.transpose(2, 0, 1, 3).reshape(tq, hq, dim)


__all__ = ["attention", "attention_prefill", "exp32", "paged_decode_attention", "rms_norm", "rope", "rope_tables",
           "swiglu"]
