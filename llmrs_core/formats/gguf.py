"""GGUF reader (introduced in chapter 1; taught in chapters 6 and 10); the writer is :mod:`.gguf_writer`.

A GGUF file is, in order (all little-endian)::

    magic "GGUF" | version u32 | tensor_count u64 | kv_count u64
    kv_count x  (key: string, value_type: u32, value)
    tensor_count x (name: string, n_dims: u32, ne: u64[n_dims], ggml_type: u32, offset: u64)
    padding to `general.alignment` (default 32)
    tensor data: each tensor at data_start + offset

A string is a u64 byte length followed by UTF-8 bytes. An array value is an
element type (u32), a count (u64) and the elements; arrays may nest.

``ne`` lists dimensions fastest-varying first (ggml order). We expose
``shape`` in NumPy order (slowest first), so ``token_embd.weight`` with
``ne = [576, 49152]`` has ``shape == (49152, 576)``: one row per token.

Every malformed input gives a ``GGUFError`` (a ``ValueError``) naming the
file, the byte offset and the field, never a crash, a hang or a huge
allocation: every count is checked against the bytes actually left.
"""

from __future__ import annotations

import enum
import functools
import itertools
import mmap
import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..quant.types import TYPE_TRAITS, GGMLType, tensor_nbytes, type_traits
from .source import WeightSource

if TYPE_CHECKING:
    from ..config import ModelConfig
    from ..tokenizer import Tokenizer

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_ARRAY_NESTING = 8


class GGUFError(ValueError):
    """A GGUF file is truncated, corrupt or unsupported. The message names where."""


class GGUFValueType(enum.IntEnum):
    """Type tags of GGUF metadata values."""

    UINT8 = 0
    INT8 = 1
    UINT16 = 2
    INT16 = 3
    UINT32 = 4
    INT32 = 5
    FLOAT32 = 6
    BOOL = 7
    STRING = 8
    ARRAY = 9
    UINT64 = 10
    INT64 = 11
    FLOAT64 = 12


# struct format of each fixed-size scalar type (the reader's and the writer's, gguf_writer.py)
SCALAR_FORMATS: dict[GGUFValueType, str] = {
    GGUFValueType.UINT8: "<B",
    GGUFValueType.INT8: "<b",
    GGUFValueType.UINT16: "<H",
    GGUFValueType.INT16: "<h",
    GGUFValueType.UINT32: "<I",
    GGUFValueType.INT32: "<i",
    GGUFValueType.FLOAT32: "<f",
    GGUFValueType.BOOL: "<?",
    GGUFValueType.UINT64: "<Q",
    GGUFValueType.INT64: "<q",
    GGUFValueType.FLOAT64: "<d",
}
NUMPY_DTYPES: dict[GGUFValueType, str] = {
    t: np.dtype(fmt.replace("?", "B")).newbyteorder("<").str for t, fmt in SCALAR_FORMATS.items()
}


@dataclass(frozen=True)
class GGUFField:
    """One metadata entry: its Python value and the GGUF types it was stored with.

    ``element_type`` is set for arrays (for nested arrays: the innermost
    non-array type is not tracked; ``element_type`` is ``ARRAY``).
    """

    value: Any
    type: GGUFValueType
    element_type: GGUFValueType | None = None


@dataclass(frozen=True)
class GGUFTensorInfo:
    """Where one tensor lives in the file.

    ``shape`` is in NumPy order (reversed ggml ``ne``); ``offset`` is relative
    to the start of the data section; ``n_bytes`` is its stored size.
    """

    name: str
    shape: tuple[int, ...]
    ggml_type: GGMLType
    offset: int
    n_bytes: int

    @property
    def n_elements(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) if self.shape else 1

    @property
    def type_name(self) -> str:
        return self.ggml_type.name


class ByteCursor:
    """Bounds-checked little-endian reads from a buffer, for error messages with offsets.

    ``pos`` is the next byte to read; every read checks the bytes left first,
    so a corrupt count fails with a message instead of a huge allocation.
    """

    def __init__(self, buf: memoryview, source: str):
        self.buf = buf
        self.pos = 0
        self.source = source

    def remaining(self) -> int:
        return len(self.buf) - self.pos

    def fail(self, what: str, at: int | None = None) -> GGUFError:
        at = self.pos if at is None else at
        return GGUFError(f"{self.source}: {what} (at byte offset {at})")

    def take(self, n: int, what: str) -> memoryview:
        if n < 0 or n > self.remaining():
            raise self.fail(
                f"file truncated while reading {what}: needs {n} bytes, "
                f"only {self.remaining()} left of {len(self.buf)}"
            )
        out = self.buf[self.pos : self.pos + n]
        self.pos += n
        return out

    def scalar(self, vtype: GGUFValueType, what: str) -> Any:
        fmt = SCALAR_FORMATS[vtype]
        start = self.pos
        raw = self.take(struct.calcsize(fmt), what)
        (value,) = struct.unpack(fmt, raw)
        if vtype is GGUFValueType.BOOL and raw[0] not in (0, 1):
            raise self.fail(f"{what}: boolean byte is {raw[0]}, expected 0 or 1", start)
        return value

    def u32(self, what: str) -> int:
        return self.scalar(GGUFValueType.UINT32, what)

    def u64(self, what: str) -> int:
        return self.scalar(GGUFValueType.UINT64, what)

    def string(self, what: str) -> str:
        start = self.pos
        n = self.u64(f"length of {what}")
        if n > self.remaining():
            raise self.fail(
                f"{what}: string length {n} runs past the end of the file "
                f"({self.remaining()} bytes left)",
                start,
            )
        raw = self.take(n, what)
        try:
            return bytes(raw).decode("utf-8")
        except UnicodeDecodeError as e:
            raise self.fail(f"{what}: not valid UTF-8 ({e.reason})", start) from None


def read_value_type(cur: ByteCursor, what: str) -> GGUFValueType:
    """A metadata value's type tag (u32), checked."""
    start = cur.pos
    raw = cur.u32(f"value type of {what}")
    try:
        return GGUFValueType(raw)
    except ValueError:
        raise cur.fail(f"{what}: unknown metadata value type {raw}", start) from None


def read_value(cur: ByteCursor, vtype: GGUFValueType, what: str, depth: int = 0) -> GGUFField:
    """One metadata value of type ``vtype`` at ``cur.pos`` (arrays recursively); ``what`` names it in errors."""
    if vtype is GGUFValueType.STRING:
        return GGUFField(cur.string(what), vtype)
    if vtype is not GGUFValueType.ARRAY:
        return GGUFField(cur.scalar(vtype, what), vtype)

    if depth >= MAX_ARRAY_NESTING:
        raise cur.fail(f"{what}: arrays nested more than {MAX_ARRAY_NESTING} deep")
    etype = read_value_type(cur, f"elements of {what}")
    start = cur.pos
    count = cur.u64(f"element count of {what}")
    # the smallest possible element: a fixed scalar, an empty string (8 bytes)
    # or an empty array (12 bytes); a count that cannot fit is corrupt
    min_size = struct.calcsize(SCALAR_FORMATS[etype]) if etype in SCALAR_FORMATS else (
        8 if etype is GGUFValueType.STRING else 12
    )
    if count * min_size > cur.remaining():
        raise cur.fail(
            f"{what}: array of {count} {etype.name} elements cannot fit in the "
            f"{cur.remaining()} bytes left",
            start,
        )
    if etype in NUMPY_DTYPES:
        raw = cur.take(count * min_size, what)
        arr = np.frombuffer(raw, dtype=NUMPY_DTYPES[etype])
        if etype is GGUFValueType.BOOL:
            if np.any(arr > 1):
                raise cur.fail(f"{what}: boolean array holds a byte other than 0 or 1", start)
            arr = arr.astype(bool)
        return GGUFField(arr.tolist(), vtype, etype)
    if etype is GGUFValueType.STRING and (items := _read_strings(cur, count)) is not None:
        return GGUFField(items, vtype, etype)
    items = [read_value(cur, etype, f"{what}[{i}]", depth + 1).value for i in range(count)]
    return GGUFField(items, vtype, etype)


_U64 = struct.Struct("<Q")


def _read_strings(cur: ByteCursor, count: int) -> list[str] | None:
    """``count`` strings at ``cur.pos``, read without the per-element bookkeeping of
    :func:`read_value` (a vocabulary is 50,000-500,000 of them: seconds, now a tenth); ``None``,
    ``cur`` untouched, if one is damaged, so that the checked path reads them again and names it."""
    buf, pos, end = cur.buf, cur.pos, len(cur.buf)
    unpack = _U64.unpack_from
    items = []
    try:
        for _ in range(count):
            if end - pos < 8:
                return None
            (n,) = unpack(buf, pos)
            pos += 8
            if n > end - pos:
                return None
            items.append(str(buf[pos : pos + n], "utf-8"))
            pos += n
    except UnicodeDecodeError:
        return None
    cur.pos = pos
    return items


def read_header(cur: ByteCursor) -> tuple[int, int, int]:
    """The 24-byte header at ``cur.pos`` (0): ``(version, tensor count, metadata count)``, checked."""
    magic = bytes(cur.take(4, "magic"))
    if magic != GGUF_MAGIC:
        raise cur.fail(f"not a GGUF file: magic is {magic!r}, expected {GGUF_MAGIC!r}", 0)
    version = cur.u32("version")
    if version not in (2, 3):
        swapped = struct.unpack(">I", struct.pack("<I", version))[0]
        if swapped in (2, 3):
            raise cur.fail("big-endian GGUF files are not supported", 4)
        if version == 1:
            raise cur.fail(
                "GGUF version 1 (32-bit counts) is not supported; re-convert the model "
                "with a current llama.cpp",
                4,
            )
        raise cur.fail(f"unsupported GGUF version {version} (supported: 2, 3)", 4)
    n_tensors = cur.u64("tensor count")
    n_kv = cur.u64("metadata key/value count")
    # each key/value takes >= 13 bytes and each tensor info >= 24
    if n_kv * 13 + n_tensors * 24 > cur.remaining():
        raise cur.fail(
            f"header claims {n_kv} metadata entries and {n_tensors} tensors, "
            f"which cannot fit in the {cur.remaining()} bytes left",
            8,
        )
    return version, n_tensors, n_kv


def read_metadata(cur: ByteCursor, n_kv: int) -> dict[str, GGUFField]:
    """The ``n_kv`` key/value entries at ``cur.pos``, in file order; a repeated key is an error."""
    fields: dict[str, GGUFField] = {}
    for i in range(n_kv):
        key_at = cur.pos
        key = cur.string(f"key of metadata entry {i}")
        if key in fields:
            raise cur.fail(f"metadata key {key!r} appears twice", key_at)
        vtype = read_value_type(cur, f"metadata {key!r}")
        fields[key] = read_value(cur, vtype, f"metadata {key!r}")
    return fields


def check_alignment(metadata: Mapping[str, Any], source: str) -> int:
    """``general.alignment`` (default 32), which must be a positive power of two."""
    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if (
        not isinstance(alignment, int)
        or isinstance(alignment, bool)
        or alignment <= 0
        or alignment & (alignment - 1)
    ):
        raise GGUFError(f"{source}: general.alignment must be a positive power of two, got {alignment!r}")
    return alignment


def read_tensor_infos(cur: ByteCursor, n_tensors: int) -> list[GGUFTensorInfo]:
    """The ``n_tensors`` tensor infos at ``cur.pos``, in file order; a repeated name is an error."""
    seen: set[str] = set()
    return [_read_tensor_info(cur, i, seen) for i in range(n_tensors)]


def _read_tensor_info(cur: ByteCursor, i: int, seen: set[str]) -> GGUFTensorInfo:
    """Tensor info ``i``: name (added to ``seen``; a repeat is an error), dimensions (ggml order,
    reversed here), type and data offset."""
    info_at = cur.pos
    name = cur.string(f"name of tensor {i}")
    if name in seen:
        raise cur.fail(f"tensor name {name!r} appears twice", info_at)
    seen.add(name)
    n_dims = cur.u32(f"dimension count of tensor {name!r}")
    if not 1 <= n_dims <= MAX_DIMS:
        raise cur.fail(f"tensor {name!r} has {n_dims} dimensions (must be 1..{MAX_DIMS})")
    ne = [cur.u64(f"dimension {d} of tensor {name!r}") for d in range(n_dims)]
    if any(n == 0 for n in ne):
        raise cur.fail(f"tensor {name!r} has a zero dimension {ne}")
    type_at = cur.pos
    type_id = cur.u32(f"type of tensor {name!r}")
    try:
        type_traits(type_id)
    except ValueError as e:
        raise cur.fail(f"tensor {name!r}: {e}", type_at) from None
    offset = cur.u64(f"data offset of tensor {name!r}")
    n_elements = 1
    for n in ne:
        n_elements *= n
    try:
        n_bytes = tensor_nbytes(type_id, n_elements, ne[0])
    except ValueError as e:
        raise cur.fail(f"tensor {name!r}: {e}", info_at) from None
    return GGUFTensorInfo(name, tuple(reversed(ne)), GGMLType(type_id), offset, n_bytes)


def check_layout(
    infos: list[GGUFTensorInfo], data_offset: int, file_size: int, alignment: int, source: str
) -> dict[str, GGUFTensorInfo]:
    """The tensors by name, once each is aligned, inside the file and clear of the others."""
    data_size = file_size - data_offset
    tensors: dict[str, GGUFTensorInfo] = {}
    for t in infos:
        if t.offset % alignment:
            raise GGUFError(
                f"{source}: tensor {t.name!r} data offset {t.offset} is not a multiple of "
                f"the alignment {alignment}"
            )
        if t.offset + t.n_bytes > data_size:
            raise GGUFError(
                f"{source}: tensor {t.name!r} needs bytes {data_offset + t.offset}.."
                f"{data_offset + t.offset + t.n_bytes} but the file has {file_size} "
                "bytes (truncated download?)"
            )
        tensors[t.name] = t
    ordered = sorted(tensors.values(), key=lambda t: t.offset)
    for a, b in itertools.pairwise(ordered):
        if a.offset + a.n_bytes > b.offset:
            raise GGUFError(f"{source}: tensors {a.name!r} and {b.name!r} overlap in the file")
    return tensors


class GGUFFile(WeightSource):
    """A parsed GGUF file: metadata, tensor infos and memory-mapped tensor data.

    Use :func:`read_gguf` to open one. ``metadata`` maps keys to Python values
    (arrays become lists); ``fields`` keeps the stored types too; ``tensors``
    maps names to :class:`GGUFTensorInfo` in file order. As a
    :class:`~llmrs_core.formats.source.WeightSource` its weights are in
    llama.cpp's interleaved RoPE order.
    """

    @property
    def rope_layout(self) -> str:
        """The architecture's RoPE pairing: llama.cpp's converter permutes W_q/W_k rows for
        interleaved pairs only for ``llama``; the other families keep Hugging Face's half-split
        order (:mod:`llmrs_core.families`)."""
        from ..families import FAMILIES

        arch = self.metadata.get("general.architecture")
        return FAMILIES[arch].rope_pairing if arch in FAMILIES else "interleaved"

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        source = str(self.path)
        try:
            self.file_size = self.path.stat().st_size
        except FileNotFoundError:
            raise FileNotFoundError(f"GGUF file not found: {source}") from None
        if self.file_size < 24:
            raise GGUFError(
                f"{source}: only {self.file_size} bytes; a GGUF header alone takes 24 "
                "(is the file truncated or empty?)"
            )
        with open(self.path, "rb") as f:
            self._mmap = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            self._parse(ByteCursor(memoryview(self._mmap), source))
        except BaseException:
            self.close()
            raise

    def _parse(self, cur: ByteCursor) -> None:
        """Header, metadata, tensor infos, then the layout of the data: each step checked before the next."""
        self.version, n_tensors, n_kv = read_header(cur)
        self.fields: dict[str, GGUFField] = read_metadata(cur, n_kv)
        self.metadata: dict[str, Any] = {k: f.value for k, f in self.fields.items()}
        self.alignment: int = check_alignment(self.metadata, cur.source)
        infos = read_tensor_infos(cur, n_tensors)
        self.data_offset = -(-cur.pos // self.alignment) * self.alignment
        self.tensors: dict[str, GGUFTensorInfo] = check_layout(
            infos, self.data_offset, self.file_size, self.alignment, cur.source
        )

    # -- tensor data -----------------------------------------------------

    def tensor_bytes(self, name: str) -> np.ndarray:
        """The stored bytes of tensor ``name`` as a read-only ``uint8`` view (no copy)."""
        info = self.tensor_info(name)
        start = self.data_offset + info.offset
        return np.frombuffer(self._mmap, dtype=np.uint8, count=info.n_bytes, offset=start)

    def tensor_array(self, name: str) -> np.ndarray:
        """A float/int tensor as a read-only array of its NumPy ``shape`` (no copy).

        Quantised types have no element dtype: use :meth:`tensor_bytes` and the
        ``quant`` module (chapter 6) to dequantise them.
        """
        info = self.tensor_info(name)
        traits = type_traits(info.ggml_type)
        if traits.dtype is None:
            kind = "a block format" if traits.block_size > 1 else "without a NumPy dtype"
            plain = ", ".join(t.name for t, tr in TYPE_TRAITS.items() if tr.dtype)
            raise TypeError(
                f"tensor {name!r} is {info.ggml_type.name}, {kind}; read it with tensor_bytes() and "
                f"dequantise it (tensor_array reads {plain})"
            )
        return self.tensor_bytes(name).view(traits.dtype).reshape(info.shape)

    # -- the weight-source interface ----------------------------------------

    @functools.cached_property
    def config(self) -> ModelConfig:
        """The architecture from the metadata (``ConfigError`` naming the missing key).

        Checked first: ``general.architecture`` is one the engine implements; the
        block count is at most the layers the file holds tensors for (nothing is built
        per layer of a damaged count); and the tokenizer's vocabulary has one embedding
        row per token (else a generated id would have no text, or a token no embedding).
        """
        from ..config import ConfigError, ModelConfig, check_architecture, check_layer_count

        check_architecture(self.metadata.get("general.architecture"), self.path)
        config = ModelConfig.from_gguf(self)
        check_layer_count(config.n_layers, self.tensors, f"{config.architecture}.block_count", self.path)
        tokens = self.metadata.get("tokenizer.ggml.tokens")
        if tokens is not None and len(tokens) != config.vocab_size:
            raise ConfigError(
                f"{self.path}: the tokenizer has {len(tokens):,} tokens but the model's vocabulary "
                f"({config.architecture}.vocab_size) is {config.vocab_size:,}: the file's tokenizer does not "
                "belong to its weights"
            )
        return config

    def float32(self, name: str) -> np.ndarray:
        """Tensor ``name`` dequantised to float32 of its NumPy shape."""
        from ..quant.dequant import dequantize

        info = self.tensor_info(name)
        return dequantize(self.tensor_bytes(name), info.ggml_type, info.shape)

    def blocks(self, name: str) -> tuple[np.ndarray, GGMLType]:
        """The stored bytes of ``name`` (no copy) and its ggml type."""
        return self.tensor_bytes(name), self.tensor_info(name).ggml_type

    def tokenizer(self) -> Tokenizer | None:
        """The tokenizer in the ``tokenizer.*`` metadata, or ``None`` if there is none."""
        from ..tokenizer import Tokenizer

        if "tokenizer.ggml.model" not in self.metadata:
            return None
        return Tokenizer.from_gguf(self)

    def tensor_info(self, name: str) -> GGUFTensorInfo:
        """The info of tensor ``name``; ``KeyError`` naming it and the file if absent."""
        try:
            return self.tensors[name]
        except KeyError:
            raise KeyError(f"no tensor named {name!r} in {self.path}") from None

    # -- lifetime --------------------------------------------------------

    def release_pages(self) -> None:
        """Drop the mapped pages from this process's resident memory (``MADV_DONTNEED`` on a
        read-only shared map: nothing is lost, a page touched again is read from the page cache)."""
        mm = getattr(self, "_mmap", None)
        if mm is not None and hasattr(mmap, "MADV_DONTNEED"):  # Linux and the BSDs; elsewhere a no-op
            mm.madvise(mmap.MADV_DONTNEED)

    def close(self) -> None:
        """Release the memory map (arrays handed out earlier must not be used after)."""
        mm = getattr(self, "_mmap", None)
        if mm is not None:
            try:
                mm.close()
            except BufferError:
                # NumPy views still point into the map; it is freed when they are.
                pass
            self._mmap = None

    def __enter__(self) -> GGUFFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"GGUFFile({str(self.path)!r}, version={self.version}, "
            f"{len(self.metadata)} metadata keys, {len(self.tensors)} tensors)"
        )


def read_gguf(path: str | os.PathLike[str]) -> GGUFFile:
    """Open and parse a GGUF file. Raises ``GGUFError`` (a ``ValueError``) if it is malformed."""
    return GGUFFile(path)
