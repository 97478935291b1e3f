"""The one table of what the engine can decode and encode, for every ggml type (chapters 6, 8, 10).

Each :class:`~llmrs_core.quant.types.GGMLType` has a :class:`Codec`:

* ``traits`` — block size, bytes per block and, for a plain element type,
  its NumPy dtype (from :data:`~llmrs_core.quant.types.TYPE_TRAITS`);
* ``dequantize`` — uint8 bytes (any shape, whole blocks) -> float32 ``[n]``;
* ``quantize`` — float32 ``[..., n]`` -> uint8 ``[..., n / block_size * type_size]``;

either function None where the engine does not support the type.
``dequant.dequantize`` and ``ggml_blocks.quantize`` look their function up
with :func:`dequantizer` / :func:`quantizer`, which raise
``NotImplementedError`` naming the type and the supported ones;
``GGUFFile.tensor_array`` reads the traits' dtype; ``kernels/cpu/packing.py``
keys its table of kernel forms (``KERNEL_FORMS``) by the same enum. (Only
``ggml_blocks.matvec`` keeps its own three fast paths, the chapter-6 lesson,
falling back to ``dequant.dequantize`` for every other type.)

Why a module of its own, not in ``quant/types.py``: the type table there
is imported by low-level code (the GGUF reader, ``config``) and by every
codec, while this table has to import every codec module (``dequant``,
``ggml_blocks``, ``kquants``, ``floats``). Those modules import it only
inside their dispatch functions, and it imports ``config`` only inside
:func:`check_computable`, so there is no import cycle. (gguf-py's
``quants.py`` keeps one class per type with both directions; here the
per-type functions stay beside the byte layouts they document, and this
table only names them.)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np

from . import dequant, ggml_blocks, iq4, kquants, kquants_low
from .types import GGMLType, TypeTraits, type_traits

if TYPE_CHECKING:
    from ..formats.source import WeightSource

Decoder = Callable[[np.ndarray], np.ndarray]
Encoder = Callable[[np.ndarray], np.ndarray]


@dataclass(frozen=True)
class Codec:
    """How to turn the stored bytes of ``ggml_type`` into float32 and back (None: unsupported)."""

    ggml_type: GGMLType
    dequantize: Decoder | None
    quantize: Encoder | None

    @property
    def traits(self) -> TypeTraits:
        return type_traits(self.ggml_type)


# -- the element types: a NumPy view and a cast ---------------------------------


def _element_decoder(ggml_type: GGMLType) -> Decoder:
    dtype = type_traits(ggml_type).dtype

    def decode(raw: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(raw).reshape(-1).view(dtype).astype(np.float32)

    decode.__name__ = decode.__qualname__ = f"dequantize_{ggml_type.name.lower()}"
    return decode


def _dequantize_bf16(raw: np.ndarray) -> np.ndarray:
    """bf16 is the top half of a float32: shift the 16 bits back into place."""
    return (np.ascontiguousarray(raw).reshape(-1).view("<u2").astype(np.uint32) << 16).view(np.float32)


def _quantize_f32(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x, dtype=np.float32).view(np.uint8)


def _quantize_f16(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(x, dtype=np.float32).astype(np.float16)).view(np.uint8)


def _quantize_bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bytes as ggml's ``ggml_compute_fp32_to_bf16``: round to nearest even on the
    bits; a NaN keeps its top 16 bits with the quiet bit (64) set, so it stays a NaN."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    rounded = (u + (0x7FFF + ((u >> 16) & 1))) >> 16  # no overflow: the largest non-NaN is 0xFF800000
    return np.where(nan, (u >> 16) | 64, rounded).astype("<u2").view(np.uint8)


# -- the table ------------------------------------------------------------------

_SUPPORTED: dict[GGMLType, tuple[Decoder | None, Encoder | None]] = {
    GGMLType.F32: (_element_decoder(GGMLType.F32), _quantize_f32),
    GGMLType.F16: (_element_decoder(GGMLType.F16), _quantize_f16),
    GGMLType.F64: (_element_decoder(GGMLType.F64), None),
    GGMLType.I8: (_element_decoder(GGMLType.I8), None),
    GGMLType.I16: (_element_decoder(GGMLType.I16), None),
    GGMLType.I32: (_element_decoder(GGMLType.I32), None),
    GGMLType.I64: (_element_decoder(GGMLType.I64), None),
    GGMLType.BF16: (_dequantize_bf16, _quantize_bf16),
    GGMLType.Q8_0: (dequant.dequantize_q8_0, ggml_blocks.quantize_q8_0),
    GGMLType.Q4_0: (dequant.dequantize_q4_0, ggml_blocks.quantize_q4_0),
    GGMLType.Q4_1: (dequant.dequantize_q4_1, ggml_blocks.quantize_q4_1),
    GGMLType.Q4_K: (kquants.dequantize_q4_k, kquants.quantize_q4_k),
    GGMLType.Q6_K: (kquants.dequantize_q6_k, kquants.quantize_q6_k),
    GGMLType.Q5_0: (dequant.dequantize_q5_0, ggml_blocks.quantize_q5_0),
    GGMLType.Q5_1: (dequant.dequantize_q5_1, ggml_blocks.quantize_q5_1),
    GGMLType.Q5_K: (kquants.dequantize_q5_k, kquants.quantize_q5_k),
    GGMLType.Q3_K: (kquants_low.dequantize_q3_k, kquants_low.quantize_q3_k),
    GGMLType.Q2_K: (kquants_low.dequantize_q2_k, kquants_low.quantize_q2_k),
    GGMLType.IQ4_NL: (dequant.dequantize_iq4_nl, iq4.quantize_iq4_nl),
    GGMLType.IQ4_XS: (iq4.dequantize_iq4_xs, iq4.quantize_iq4_xs),
}

#: every ggml type, with None for what the engine cannot do with it
CODECS: dict[GGMLType, Codec] = {t: Codec(t, *_SUPPORTED.get(t, (None, None))) for t in GGMLType}


def supported(op: Literal["dequantize", "quantize"]) -> list[GGMLType]:
    """The types that have a ``op`` function, in enum order."""
    return [t for t, c in CODECS.items() if getattr(c, op) is not None]


def _lookup(ggml_type: GGMLType | int, op: Literal["dequantize", "quantize"]) -> Callable:
    t = GGMLType(ggml_type)
    fn = getattr(CODECS[t], op)
    if fn is None:
        verb = "dequantising" if op == "dequantize" else "quantising to"
        names = ", ".join(s.name for s in supported(op))
        raise NotImplementedError(f"{verb} {t.name} is not supported (supported: {names})")
    return fn


def dequantizer(ggml_type: GGMLType | int) -> Decoder:
    """The bytes -> float32 ``[n]`` function of a type; ``NotImplementedError`` listing the supported ones."""
    return _lookup(ggml_type, "dequantize")


def quantizer(ggml_type: GGMLType | int) -> Encoder:
    """The float32 ``[..., n]`` -> bytes function of a type; ``NotImplementedError`` listing the supported ones."""
    return _lookup(ggml_type, "quantize")


def check_computable(source: WeightSource, names: Iterable[str] | None = None) -> None:
    """Refuse a model file holding a tensor type the engine cannot compute, before any weight is read.

    Every ggml type is known by name and size (``quant.types``), so a
    file of any type opens and lists (``llmrs info``); computing needs its
    dequantiser. ``names``: the tensors the model will read (default: all of
    them). A type name that is not a ggml type (a safetensors dtype such as
    ``U8``) is its own reader's to decode and is not judged here. Raises
    ``ConfigError`` naming the file, each offending tensor with its type,
    and the types supported.
    """
    wanted = source.tensors if names is None else names
    bad = [(name, source.tensors[name].type_name) for name in wanted
           if not _computable(source.tensors[name].type_name)]
    if not bad:
        return
    from ..config import ConfigError  # here, not at the top: config imports quant/ (the type table)

    shown = ", ".join(f"{name} ({type_name})" for name, type_name in bad[:8])
    more = f" and {len(bad) - 8} more" if len(bad) > 8 else ""
    names = ", ".join(t.name for t in supported("dequantize"))
    raise ConfigError(
        f"{source.path}: {len(bad)} tensor(s) of a type this engine cannot compute: {shown}{more}; "
        f"supported types: {names}"
    )


def _computable(type_name: str) -> bool:
    """False for a ggml type without a dequantiser; True otherwise."""
    t = GGMLType.__members__.get(type_name.upper())
    return t is None or CODECS[t].dequantize is not None


__all__ = ["CODECS", "Codec", "check_computable", "dequantizer", "quantizer", "supported"]
