"""Small floating-point formats: FP16, BF16, FP8 E4M3 and FP8 E5M2 (introduced in chapter 6).

Every format here is a sign bit, ``E`` exponent bits and ``M`` mantissa bits::

    value = (-1)**s * 2**(e - bias) * 1.m     exponent field e in 1 .. top   (normal)
    value = (-1)**s * 2**(1 - bias) * 0.m     exponent field e == 0          (subnormal)

and the formats differ only in ``E``, ``M``, ``bias`` and what the top
exponent field means:

* **IEEE-like** (FP16, BF16, FP8 E5M2): the all-ones exponent is infinity (mantissa 0) or NaN.
* **"fn"** (FP8 E4M3, NVIDIA's and the OCP spec's): ordinary numbers but ``S.1111.111``,
  the only NaN; max 448 instead of 240 (chapter 6.1 explains).

:func:`encode` turns float32 into bit patterns (``uint16`` for 16-bit
formats, ``uint8`` for FP8) by integer arithmetic on the float32 bits, with
round-to-nearest-even, subnormals, signed zero and NaN handled; :func:`decode`
turns bit patterns back into float32, exactly (every value of these formats
is a float32). Both are vectorised over arrays of any shape.

Out-of-range values (``|x|`` rounds above ``max_finite``, or is infinite):

* ``saturate=False`` (default, the IEEE and OCP "non-saturating" rule, and
  what NumPy's float16 and ``ml_dtypes`` casts do): infinity where the format
  has one, otherwise NaN. So E4M3 gives NaN for 480.0 and for ``inf``.
* ``saturate=True`` (CUDA's ``__NV_SATFINITE``, what FP8 weight and
  activation quantisers use): clamp to ``+-max_finite``, infinities included.

NaN stays NaN in both modes (sign kept, payload not: the canonical quiet NaN).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = [
    "BF16",
    "FORMATS",
    "FP8_E4M3",
    "FP8_E5M2",
    "FP16",
    "FloatFormat",
    "decode",
    "encode",
    "float_format",
    "get_format",
    "round_trip",
]

_F32_MANTISSA = 23
_F32_BIAS = 127


@dataclass(frozen=True)
class FloatFormat:
    """A sign / exponent / mantissa layout and the numbers it implies.

    Build one with :func:`float_format`, which computes ``max_finite``,
    ``min_normal`` and ``min_subnormal`` from the layout.
    """

    name: str
    exponent_bits: int
    mantissa_bits: int
    bias: int
    has_inf: bool
    max_finite: float
    min_normal: float
    min_subnormal: float

    @property
    def bits(self) -> int:
        """Total width: sign + exponent + mantissa."""
        return 1 + self.exponent_bits + self.mantissa_bits

    @property
    def storage_dtype(self) -> type[np.unsignedinteger]:
        """The unsigned integer type that holds one bit pattern."""
        return np.uint8 if self.bits <= 8 else np.uint16

    @property
    def epsilon(self) -> float:
        """Gap between 1.0 and the next value: the relative precision, ``2**-M``."""
        return 2.0**-self.mantissa_bits

    @property
    def _top_exponent(self) -> int:
        return (1 << self.exponent_bits) - 1

    @property
    def _max_code(self) -> int:
        """Magnitude bits (exponent and mantissa, no sign) of ``max_finite``."""
        all_mantissa = (1 << self.mantissa_bits) - 1
        if self.has_inf:
            return ((self._top_exponent - 1) << self.mantissa_bits) | all_mantissa
        return (self._top_exponent << self.mantissa_bits) | (all_mantissa - 1)

    @property
    def _inf_code(self) -> int:
        return self._top_exponent << self.mantissa_bits

    @property
    def _nan_code(self) -> int:
        """Canonical NaN: quiet bit (top mantissa bit) set, or all ones for "fn" formats."""
        if self.has_inf:
            return self._inf_code | (1 << (self.mantissa_bits - 1))
        return (self._top_exponent << self.mantissa_bits) | ((1 << self.mantissa_bits) - 1)


def float_format(
    name: str, exponent_bits: int, mantissa_bits: int, bias: int | None = None, has_inf: bool = True
) -> FloatFormat:
    """Describe a layout and compute its range.

    ``bias`` defaults to the IEEE ``2**(E-1) - 1``. With ``has_inf=False`` the
    top exponent holds numbers and only the all-ones pattern is NaN (the "fn"
    convention of FP8 E4M3). The format must fit inside float32 (at most 8
    exponent and 23 mantissa bits, and an exponent range within float32's) so
    that :func:`decode` is exact.
    """
    if not 1 <= exponent_bits <= 8 or not 1 <= mantissa_bits <= _F32_MANTISSA:
        raise ValueError(
            f"format {name!r}: need 1..8 exponent bits and 1..23 mantissa bits, got {exponent_bits} and {mantissa_bits}"
        )
    if 1 + exponent_bits + mantissa_bits > 16:
        raise ValueError(f"format {name!r}: at most 16 bits in all, got {1 + exponent_bits + mantissa_bits}")
    if bias is None:
        bias = (1 << (exponent_bits - 1)) - 1
    top = (1 << exponent_bits) - 1
    max_exponent = (top - 1 if has_inf else top) - bias
    if 1 - bias < 1 - _F32_BIAS or max_exponent > _F32_BIAS:
        raise ValueError(f"format {name!r}: bias {bias} puts its exponent range outside float32's")
    # largest mantissa: all ones, except in "fn" formats where all ones at the top exponent is NaN
    top_mantissa = (1 << mantissa_bits) - (1 if has_inf else 2)
    return FloatFormat(
        name=name,
        exponent_bits=exponent_bits,
        mantissa_bits=mantissa_bits,
        bias=bias,
        has_inf=has_inf,
        max_finite=(1.0 + top_mantissa / (1 << mantissa_bits)) * 2.0**max_exponent,
        min_normal=2.0 ** (1 - bias),
        min_subnormal=2.0 ** (1 - bias - mantissa_bits),
    )


FP16 = float_format("fp16", 5, 10)  # IEEE binary16: max 65504
BF16 = float_format("bf16", 8, 7)  # float32's exponent, 7 mantissa bits
FP8_E4M3 = float_format("fp8_e4m3", 4, 3, has_inf=False)  # OCP / NVIDIA E4M3 ("e4m3fn"): max 448
FP8_E5M2 = float_format("fp8_e5m2", 5, 2)  # IEEE-like: max 57344, has inf
FORMATS: dict[str, FloatFormat] = {f.name: f for f in (FP16, BF16, FP8_E4M3, FP8_E5M2)}


def get_format(fmt: FloatFormat | str) -> FloatFormat:
    """A :class:`FloatFormat`, or the name of one in :data:`FORMATS`."""
    if isinstance(fmt, FloatFormat):
        return fmt
    if fmt in FORMATS:
        return FORMATS[fmt]
    raise ValueError(f"unknown float format {fmt!r}; known: {', '.join(FORMATS)}")


def encode(x: np.ndarray, fmt: FloatFormat | str, *, saturate: bool = False) -> np.ndarray:
    """float32 values -> bit patterns of ``fmt``, same shape, round-to-nearest-even.

    Returns ``uint16`` for 16-bit formats, ``uint8`` for FP8. Other float
    inputs are first converted to float32 (from float64 that is a second
    rounding). See the module docstring for ``saturate``.
    """
    fmt = get_format(fmt)
    x = np.asarray(x)
    if not np.issubdtype(x.dtype, np.floating):
        raise ValueError(f"encode needs floating-point input, got dtype {x.dtype}")
    bits = x.astype(np.float32).view(np.uint32).astype(np.int64)
    m = fmt.mantissa_bits

    sign = bits >> 31
    magnitude = bits & 0x7FFFFFFF
    is_nan = magnitude > 0x7F800000
    f32_exponent = magnitude >> _F32_MANTISSA
    f32_mantissa = magnitude & ((1 << _F32_MANTISSA) - 1)

    # Exact value = significand * 2**(e - 23), with the implicit 1 made explicit;
    # float32 subnormals have no implicit bit and sit at e = -126.
    is_normal = f32_exponent > 0
    significand = np.where(is_normal, f32_mantissa | (1 << _F32_MANTISSA), f32_mantissa)
    e = np.where(is_normal, f32_exponent - _F32_BIAS, 1 - _F32_BIAS)

    # The target spaces its values 2**(e_t - m) apart, e_t never below its
    # smallest normal exponent (below that lie the evenly spaced subnormals).
    # Count the value in those steps: shift the significand right, rounding.
    e_t = np.maximum(e, 1 - fmt.bias)
    shift = np.minimum((e_t - m) - (e - _F32_MANTISSA), 40)  # >= 0; 40 already rounds all 24 bits away
    steps = significand >> shift
    remainder = significand - (steps << shift)
    half = (1 << shift) >> 1
    round_up = (remainder > half) | ((remainder == half) & (shift > 0) & ((steps & 1) == 1))
    steps = steps + round_up

    # steps is 1.m (normal) or 0.m (subnormal, e_t at the floor) in units of the
    # last mantissa bit, so adding the exponent field above it gives the
    # magnitude bits directly: a carry out of the mantissa (1.111 -> 10.000)
    # lands in the exponent, and a subnormal that rounds up to 1.000 becomes the
    # smallest normal, with no special case.
    code = ((e_t + fmt.bias - 1) << m) + steps

    # Infinities have e = 128, so they overflow here together with the too-large finite values.
    if saturate:
        overflow_code = fmt._max_code
    else:
        overflow_code = fmt._inf_code if fmt.has_inf else fmt._nan_code
    code = np.where(code > fmt._max_code, overflow_code, code)
    code = np.where(is_nan, fmt._nan_code, code)
    out = (sign << (fmt.exponent_bits + m)) | code
    return out.astype(fmt.storage_dtype)


def decode(bits: np.ndarray, fmt: FloatFormat | str) -> np.ndarray:
    """Bit patterns of ``fmt`` (any integer dtype) -> float32 values, same shape, exact."""
    fmt = get_format(fmt)
    bits = np.asarray(bits)
    if not np.issubdtype(bits.dtype, np.integer):
        raise ValueError(f"decode needs integer bit patterns, got dtype {bits.dtype}")
    if bits.size and (bits.min() < 0 or bits.max() >= (1 << fmt.bits)):
        raise ValueError(
            f"bit patterns out of range for {fmt.bits}-bit {fmt.name}: [{bits.min()}, {bits.max()}]"
        )
    b = bits.astype(np.int64)
    m = fmt.mantissa_bits
    sign = b >> (fmt.exponent_bits + m)
    code = b & ((1 << (fmt.exponent_bits + m)) - 1)
    exponent = code >> m
    mantissa = code & ((1 << m) - 1)

    # normal: rebias the exponent and left-align the mantissa in float32's 23 bits
    normal = ((exponent - fmt.bias + _F32_BIAS) << _F32_MANTISSA) | (mantissa << (_F32_MANTISSA - m))
    # subnormal: 0.m * 2**(1 - bias) = mantissa * 2**(1 - bias - m); exact, a power-of-two scaling
    subnormal = np.ldexp(mantissa.astype(np.float32), 1 - fmt.bias - m).view(np.uint32).astype(np.int64)
    magnitude = np.where(exponent == 0, subnormal, normal)

    if fmt.has_inf:
        top = exponent == fmt._top_exponent
        magnitude = np.where(top, np.where(mantissa == 0, 0x7F800000, 0x7FC00000), magnitude)
    else:
        magnitude = np.where(code == fmt._nan_code, 0x7FC00000, magnitude)
    return ((sign << 31) | magnitude).astype(np.uint32).view(np.float32)


def round_trip(x: np.ndarray, fmt: FloatFormat | str, *, saturate: bool = False) -> np.ndarray:
    """``decode(encode(x))``: ``x`` as float32 after storage in ``fmt`` (for error plots)."""
    return decode(encode(x, fmt, saturate=saturate), fmt)
