"""The one table of what the engine can decode and encode, for every ggml type (chapters 6, 8, 10).

Each :class:`~llmrs_core.formats.ggml_types.GGMLType` has a :class:`Codec`:

* ``traits`` — block size, bytes per block and, for a plain element type,
  its NumPy dtype (from :data:`~llmrs_core.formats.ggml_types.TYPE_TRAITS`);
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

Why a module of its own in ``quant/``, not in ``formats/ggml_types.py``:
the type table there is imported by low-level code (the GGUF reader,
``config``) that must not pull in the codecs, while this table has to
import every codec module (``dequant``, ``ggml_blocks``, ``kquants``,
``floats``). Those modules import it only inside their dispatch functions,
so there is no import cycle. (gguf-py's ``quants.py`` keeps one class per
type with both directions; here the per-type functions stay beside the byte
layouts they document, and this table only names them.)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np

from ..formats.ggml_types import GGMLType, TypeTraits, type_traits
from . import dequant, ggml_blocks, kquants

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
        return raw.view(dtype).astype(np.float32)

    decode.__name__ = decode.__qualname__ = f"dequantize_{ggml_type.name.lower()}"
    return decode


def _dequantize_bf16(raw: np.ndarray) -> np.ndarray:
    """bf16 is the top half of a float32: shift the 16 bits back into place."""
    return (raw.view("<u2").astype(np.uint32) << 16).view(np.float32)


def _quantize_f32(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x, dtype=np.float32).view(np.uint8)


def _quantize_f16(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(x, dtype=np.float32).astype(np.float16)).view(np.uint8)


def _quantize_bf16(x: np.ndarray) -> np.ndarray:
    from .floats import encode

    return np.ascontiguousarray(encode(np.asarray(x, dtype=np.float32), "bf16")).view(np.uint8)


# -- the table ------------------------------------------------------------------

_SUPPORTED: dict[GGMLType, tuple[Decoder | None, Encoder | None]] = {
    GGMLType.F32: (_element_decoder(GGMLType.F32), _quantize_f32),
    GGMLType.F16: (_element_decoder(GGMLType.F16), _quantize_f16),
    GGMLType.F64: (_element_decoder(GGMLType.F64), None),
    GGMLType.BF16: (_dequantize_bf16, _quantize_bf16),
    GGMLType.Q8_0: (dequant.dequantize_q8_0, ggml_blocks.quantize_q8_0),
    GGMLType.Q4_0: (dequant.dequantize_q4_0, ggml_blocks.quantize_q4_0),
    GGMLType.Q4_1: (dequant.dequantize_q4_1, ggml_blocks.quantize_q4_1),
    GGMLType.Q4_K: (kquants.dequantize_q4_k, kquants.quantize_q4_k),
    GGMLType.Q6_K: (kquants.dequantize_q6_k, kquants.quantize_q6_k),
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


__all__ = ["CODECS", "Codec", "dequantizer", "quantizer", "supported"]
