"""INT8 and INT4 quantisation: symmetric and affine, per tensor, channel or group (introduced in chapter 6).

A quantiser stores each value ``x`` as a small integer code ``q`` and keeps a
float32 ``scale`` (and for the affine scheme a ``zero_point``) per block of
values::

    symmetric   q = round(x / scale),             x_hat = scale * q
    asymmetric  q = round(x / scale) + zero_point, x_hat = scale * (q - zero_point)

Code ranges (``round`` is round-half-to-even, ``np.rint``):

==========  =================  ====================================================
bits        symmetric          asymmetric (affine)
==========  =================  ====================================================
8           [-127, 127]        [-128, 127]  signed int8, zero point in that range
4           [-7, 7]            [0, 15]      unsigned 4-bit, the usual choice
==========  =================  ====================================================

Symmetric: ``scale = max|x| / qmax`` in float64, stored as the float32 neighbour
above, so ``max|x| / scale`` never passes ``qmax`` (it matters for subnormal scales
only, see :func:`disagreement`). The most negative code stays unused: ``x`` and
``-x`` get opposite codes, nothing is clipped, every error is at most ``scale / 2``.
Asymmetric: ``scale = (max - min) / (qmax - qmin)`` over a range widened to include
0, so 0.0 is stored exactly and the zero point is a whole code.

Granularity: a scale per ``"tensor"``; per ``"channel"``, i.e. per output
row (axis 0 of a ``[out, in]`` weight, any trailing axes belong to the row);
or per ``"group"`` of ``group_size`` consecutive elements along the last
axis. Why each choice, and what it costs in SQNR on a real matrix: chapter 6.2.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

__all__ = [
    "QuantError",
    "QuantScheme",
    "QuantizedTensor",
    "disagreement",
    "max_abs_error",
    "pack_int4",
    "quantization_error",
    "quantize",
    "rmse",
    "sqnr_db",
    "unpack_int4",
]

Granularity = Literal["tensor", "channel", "group"]

_MAX_ABS = 1e38  # a little below float32's 3.4e38, so that dequantising cannot overflow


@dataclass(frozen=True)
class QuantScheme:
    """How values were quantised: width, symmetry, and the block a scale covers."""

    bits: int
    symmetric: bool
    granularity: Granularity
    group_size: int | None = None

    def __post_init__(self) -> None:
        if self.bits not in (4, 8):
            raise ValueError(f"bits must be 4 or 8, got {self.bits}")
        if self.granularity not in ("tensor", "channel", "group"):
            raise ValueError(f"granularity must be 'tensor', 'channel' or 'group', got {self.granularity!r}")
        if self.granularity == "group":
            if not isinstance(self.group_size, int | np.integer) or self.group_size < 1:
                raise ValueError(
                    f"granularity 'group' needs a positive integer group_size, got {self.group_size!r}"
                )
        elif self.group_size is not None:
            raise ValueError(f"group_size is only for granularity 'group', not {self.granularity!r}")

    @property
    def qmin(self) -> int:
        if self.symmetric:
            return -self.qmax
        return -128 if self.bits == 8 else 0

    @property
    def qmax(self) -> int:
        if self.symmetric:
            return (1 << (self.bits - 1)) - 1
        return 127 if self.bits == 8 else 15

    @property
    def code_dtype(self) -> type[np.integer]:
        """int8, except asymmetric int4, whose codes 0..15 are unsigned."""
        return np.uint8 if (self.bits == 4 and not self.symmetric) else np.int8


@dataclass(frozen=True)
class QuantizedTensor:
    """Integer codes plus what is needed to rebuild float32 values.

    ``codes`` has the original shape (one code per value, not yet nibble
    packed: see :func:`pack_int4`). ``scales`` (float32) and ``zero_points``
    (codes' dtype; ``None`` when symmetric) have shape ``()`` per tensor,
    ``[out]`` per channel, ``[..., n // group_size]`` per group.
    """

    codes: np.ndarray
    scales: np.ndarray
    zero_points: np.ndarray | None
    scheme: QuantScheme

    @property
    def shape(self) -> tuple[int, ...]:
        return self.codes.shape

    def dequantize(self) -> np.ndarray:
        """float32 array of the original shape: ``scale * (code - zero_point)``."""
        q = _blocks(self.codes, self.scheme).astype(np.float32)
        if self.zero_points is not None:
            q = q - self.zero_points.reshape(-1, 1).astype(np.float32)
        return (q * self.scales.reshape(-1, 1)).reshape(self.codes.shape)

    @property
    def nbytes(self) -> int:
        """Storage with int4 codes packed two per byte: codes + scales + zero points."""
        code_bytes = (self.codes.size + 1) // 2 if self.scheme.bits == 4 else self.codes.size
        zp_bytes = 0 if self.zero_points is None else self.zero_points.nbytes
        return code_bytes + self.scales.nbytes + zp_bytes


def _blocks(x: np.ndarray, scheme: QuantScheme) -> np.ndarray:
    """View ``x`` as ``[n_blocks, block_len]``: one row per scale."""
    if scheme.granularity == "tensor":
        return x.reshape(1, -1)
    if scheme.granularity == "channel":
        return x.reshape(x.shape[0], -1)
    return x.reshape(-1, scheme.group_size)


def _scale_shape(shape: tuple[int, ...], scheme: QuantScheme) -> tuple[int, ...]:
    if scheme.granularity == "tensor":
        return ()
    if scheme.granularity == "channel":
        return (shape[0],)
    return (*shape[:-1], shape[-1] // scheme.group_size)


def _round_up_to_float32(s: np.ndarray) -> np.ndarray:
    """float64 scales -> float32, never smaller: a scale rounded down would push
    the extreme values past ``qmax`` and clip them (tiny, subnormal scales lose many bits)."""
    s32 = s.astype(np.float32)
    with np.errstate(under="ignore"):  # the step above a tiny scale may be subnormal: that is fine
        return np.where(s32 < s, np.nextafter(s32, np.float32(np.inf)), s32)


def _check_input(x: np.ndarray, scheme: QuantScheme) -> None:
    if not (np.issubdtype(x.dtype, np.floating) or np.issubdtype(x.dtype, np.integer)):
        raise ValueError(f"quantize needs a real numeric array, got dtype {x.dtype}")
    if x.size == 0:
        raise ValueError(f"cannot quantize an empty array (shape {x.shape})")
    if not np.all(np.isfinite(x)):
        bad = np.flatnonzero(~np.isfinite(x.reshape(-1)))
        raise ValueError(
            f"cannot quantize non-finite values: {bad.size} of them, first at flat index {bad[0]}"
        )
    if np.abs(x).max() > _MAX_ABS:
        # scale * code rounds past float32's largest value up there: inf, a silent wrong answer
        raise ValueError(f"cannot quantize values beyond +-{_MAX_ABS:g} (max |x| = {np.abs(x).max():g})")
    if scheme.granularity == "channel" and x.ndim < 2:
        raise ValueError(f"per-channel quantisation needs an [out, in] array, got shape {x.shape}")
    if scheme.granularity == "group":
        row = x.shape[-1] if x.ndim else 1
        if row % scheme.group_size:
            raise ValueError(
                f"group_size {scheme.group_size} does not divide the last axis ({row}) of shape {x.shape}"
            )


def quantize(
    x: np.ndarray,
    *,
    bits: int = 8,
    symmetric: bool = True,
    granularity: Granularity = "tensor",
    group_size: int | None = None,
) -> QuantizedTensor:
    """Quantise ``x`` (any shape; ``[out, in]`` for ``"channel"``) to ``bits``-bit codes.

    Raises ``ValueError`` for non-finite values or ``|x| > 1e38``, a ``group_size`` that does not
    divide the last axis, or an unknown ``bits`` / ``granularity``. A block of
    zeros gets scale 0 and codes that dequantise to exactly 0 (never NaN).
    """
    scheme = QuantScheme(bits, symmetric, granularity, group_size)
    x = np.asarray(x)
    _check_input(x, scheme)
    # statistics in float64: max - min of two large float32 values can overflow float32
    blocks = _blocks(x.astype(np.float64), scheme)
    lo = np.minimum(blocks.min(axis=1), 0.0)
    hi = np.maximum(blocks.max(axis=1), 0.0)
    exact = np.maximum(-lo, hi) / scheme.qmax if symmetric else (hi - lo) / (scheme.qmax - scheme.qmin)
    scales = _round_up_to_float32(exact)
    # an all-zero block has scale 0: divide by 1 instead, giving code 0 (or the zero point)
    divisor = np.where(scales > 0, scales, 1.0).astype(np.float64)[:, None]
    if symmetric:
        zero_points = None
        codes = np.rint(blocks / divisor)
    else:
        # lo <= 0 <= hi, so qmin - lo / scale lies in [qmin, qmax]: the clip only absorbs rounding
        zp = np.clip(np.rint(scheme.qmin - lo / divisor[:, 0]), scheme.qmin, scheme.qmax)
        codes = np.rint(blocks / divisor) + zp[:, None]
        zero_points = zp.astype(scheme.code_dtype).reshape(_scale_shape(x.shape, scheme))
    codes = np.clip(codes, scheme.qmin, scheme.qmax).astype(scheme.code_dtype).reshape(x.shape)
    return QuantizedTensor(codes, scales.reshape(_scale_shape(x.shape, scheme)), zero_points, scheme)


def pack_int4(codes: np.ndarray) -> np.ndarray:
    """Pack 4-bit codes two per byte along the last axis: ``[..., n]`` -> ``[..., n // 2]`` uint8.

    Element ``2i`` goes in the low nibble of byte ``i``, element ``2i + 1`` in
    the high nibble. Signed codes (int8 in [-8, 7]) are stored two's complement;
    unsigned codes (uint8 in [0, 15]) as they are. ``n`` must be even.

    GGML's Q4 blocks order nibbles differently: byte ``j`` of a 32-element
    block holds element ``j`` low and element ``j + 16`` high, so the low
    nibbles are elements 0..15 and the high nibbles 16..31.
    """
    codes = np.asarray(codes)
    if not np.issubdtype(codes.dtype, np.integer):
        raise ValueError(f"pack_int4 needs integer codes, got dtype {codes.dtype}")
    if codes.ndim == 0 or codes.shape[-1] % 2:
        raise ValueError(f"pack_int4 needs an even-length last axis, got shape {codes.shape}")
    lo, hi = (-8, 7) if np.issubdtype(codes.dtype, np.signedinteger) else (0, 15)
    if codes.size and (codes.min() < lo or codes.max() > hi):
        raise ValueError(
            f"4-bit codes of dtype {codes.dtype} must lie in [{lo}, {hi}], got [{codes.min()}, {codes.max()}]"
        )
    nibbles = (codes.astype(np.int16) & 0x0F).astype(np.uint8)  # & 0x0F keeps the two's-complement low bits
    return nibbles[..., 0::2] | (nibbles[..., 1::2] << 4)


def unpack_int4(packed: np.ndarray, *, signed: bool) -> np.ndarray:
    """Inverse of :func:`pack_int4`: ``[..., m]`` uint8 -> ``[..., 2m]``, int8 if ``signed`` else uint8."""
    packed = np.asarray(packed)
    if packed.dtype != np.uint8:
        raise ValueError(f"unpack_int4 needs uint8 bytes, got dtype {packed.dtype}")
    if packed.ndim == 0:
        raise ValueError("unpack_int4 needs at least one axis")
    out = np.empty((*packed.shape[:-1], 2 * packed.shape[-1]), dtype=np.uint8)
    out[..., 0::2] = packed & 0x0F
    out[..., 1::2] = packed >> 4
    if signed:
        # sign-extend the 4-bit two's complement: 8..15 -> -8..-1
        return ((out.astype(np.int8) ^ 8) - 8).astype(np.int8)
    return out


def disagreement(x: np.ndarray, ours: QuantizedTensor, ref: QuantizedTensor) -> str | None:
    """How ``ours`` differs from ``ref`` as a quantisation of ``x`` beyond what rounding allows;
    ``None`` when the two agree.

    Two correct quantisers can differ by rounding alone. The exact scale (a float64 quotient)
    lies between two float32 values and either is a fair choice: :func:`quantize` takes the
    one above, rounding to nearest takes the one below about half of the time. With scales one
    float32 step (ulp) apart, a value on a tie (``x / scale`` half-way between two codes, which
    is common when ``x`` itself lies on a grid, as dequantised weights do) rounds to either code.
    So ``ours`` agrees when it has the same scheme, shapes and dtypes, scales equal to ``ref``'s or
    their float32 neighbours, the same zero points, and the same codes except at a tie, where a
    code may be one apart. ``x``: the array both quantised, any shape.
    """
    if ours.scheme != ref.scheme:
        return f"scheme {ours.scheme}, the reference's is {ref.scheme}"
    for what, a, b in (("codes", ours.codes, ref.codes), ("scales", ours.scales, ref.scales)):
        a = np.asarray(a)
        if a.shape != b.shape or a.dtype != b.dtype:
            return f"{what} of shape {a.shape} and dtype {a.dtype}, the reference's {b.shape} {b.dtype}"
    if (ours.zero_points is None) != (ref.zero_points is None):
        return f"zero points {'None' if ours.zero_points is None else 'given'}, the reference's are not"
    so, sr = (np.asarray(q.scales, np.float64).reshape(-1) for q in (ours, ref))
    # float32 values in order are their bit patterns in order: the difference counts the float32 values apart
    steps = np.abs(np.asarray(ours.scales).reshape(-1).view(np.int32).astype(np.int64)
                   - ref.scales.reshape(-1).view(np.int32).astype(np.int64))
    if not np.all(steps <= 1):
        i = int(np.argmax(steps))
        return (f"the scale of block {i} is {so[i]:.9g}, the reference's {sr[i]:.9g}: {steps[i]} float32 steps "
                "apart, where rounding the exact scale to float32 allows 1")
    zr = np.zeros(len(sr)) if ref.zero_points is None else ref.zero_points.reshape(-1).astype(np.float64)
    if ours.zero_points is not None and not np.array_equal(ours.zero_points, ref.zero_points):
        i = int(np.flatnonzero(ours.zero_points.reshape(-1) != ref.zero_points.reshape(-1))[0])
        return f"the zero point of block {i} is {ours.zero_points.reshape(-1)[i]}, the reference's {int(zr[i])}"
    # where each value lies between codes, on the reference's scale; a block of zeros divides by 1, as quantize does
    xb = _blocks(np.asarray(x, np.float64), ref.scheme)
    inv_o, inv_r = (np.where(s > 0, 1.0 / np.where(s > 0, s, 1.0), 1.0)[:, None] for s in (so, sr))
    t = xb * inv_r + zr[:, None]
    # how far ours may see it moved: its own scale, and a float32 quotient (half an ulp, doubled)
    slack = np.abs(xb) * np.abs(inv_o - inv_r) + np.abs(t) * 2.0**-23
    co, cr = (_blocks(q.codes, ref.scheme).astype(np.int64) for q in (ours, ref))
    tie = (np.abs(co - cr) == 1) & (np.abs(t - (co + cr) / 2) <= slack)
    bad = np.flatnonzero(((co != cr) & ~tie).reshape(-1))
    if bad.size:
        i = int(bad[0])
        at = tuple(int(k) for k in np.unravel_index(i, ours.codes.shape))
        return (f"{bad.size} codes differ by more than a tie allows; the first, at {at}, is {co.reshape(-1)[i]}, "
                f"the reference's {cr.reshape(-1)[i]}, where x / scale (+ zero point) = {t.reshape(-1)[i]:.6g}")
    return None


@dataclass(frozen=True)
class QuantError:
    """How far dequantised values are from the originals."""

    max_abs: float
    rmse: float
    sqnr_db: float  # signal power over noise power, in decibels: about 6 dB per bit


def _pair(x: np.ndarray, q: QuantizedTensor | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    x_hat = q.dequantize() if isinstance(q, QuantizedTensor) else np.asarray(q)
    x = np.asarray(x)
    if x.shape != x_hat.shape:
        raise ValueError(f"shapes differ: original {x.shape}, quantised {x_hat.shape}")
    return x.astype(np.float64), x_hat.astype(np.float64)


def max_abs_error(x: np.ndarray, q: QuantizedTensor | np.ndarray) -> float:
    """``max |x - x_hat|``; ``q`` is a :class:`QuantizedTensor` or already dequantised values."""
    x, x_hat = _pair(x, q)
    return float(np.max(np.abs(x - x_hat))) if x.size else 0.0


def rmse(x: np.ndarray, q: QuantizedTensor | np.ndarray) -> float:
    """Root mean square of ``x - x_hat``."""
    x, x_hat = _pair(x, q)
    return float(np.sqrt(np.mean((x - x_hat) ** 2))) if x.size else 0.0


def sqnr_db(x: np.ndarray, q: QuantizedTensor | np.ndarray) -> float:
    """``10 log10(sum x^2 / sum (x - x_hat)^2)``; ``inf`` when there is no error at all."""
    x, x_hat = _pair(x, q)
    noise = float(np.sum((x - x_hat) ** 2))
    if noise == 0.0:
        return float("inf")
    signal = float(np.sum(x**2))
    return 10.0 * float(np.log10(signal / noise)) if signal > 0 else float("-inf")


def quantization_error(x: np.ndarray, q: QuantizedTensor | np.ndarray) -> QuantError:
    """Max abs error, RMSE and SQNR of ``q`` against the original ``x``."""
    return QuantError(max_abs_error(x, q), rmse(x, q), sqnr_db(x, q))
