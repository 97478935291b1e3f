"""safetensors: reader and writer written from the format description (chapter 10).

A ``.safetensors`` file is::

    N: u64 little-endian        length of the header
    header: N bytes of UTF-8 JSON {"name": {"dtype": "F32", "shape": [r, c],
                                            "data_offsets": [begin, end]}, ...,
                                   "__metadata__": {"key": "value", ...}}
    data: the tensors' bytes, little-endian, C order, offsets relative to here

Nothing in it is executable — the reason it replaced pickle-based ``.bin``
checkpoints. The reader checks what the format promises (offsets inside
the data, sizes matching dtype x shape, no overlaps, no holes) and memory-maps
the data, so a tensor is a zero-copy NumPy view. Every malformed file gives a
``SafetensorsError`` (a ``ValueError``) naming the file and the field.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

MAX_HEADER_BYTES = 100 * 2**20  # the reference implementation's limit

# safetensors dtype name -> (NumPy dtype, bytes per element). BF16 has no NumPy
# dtype: it is read as uint16 bits and widened to float32 by ``to_float32``.
DTYPES: dict[str, tuple[str, int]] = {
    "F64": ("<f8", 8), "F32": ("<f4", 4), "F16": ("<f2", 2), "BF16": ("<u2", 2),
    "I64": ("<i8", 8), "I32": ("<i4", 4), "I16": ("<i2", 2), "I8": ("i1", 1),
    "U64": ("<u8", 8), "U32": ("<u4", 4), "U16": ("<u2", 2), "U8": ("u1", 1), "BOOL": ("?", 1),
}
_NUMPY_TO_NAME = {"float64": "F64", "float32": "F32", "float16": "F16", "int64": "I64", "int32": "I32",
                  "int16": "I16", "int8": "I8", "uint64": "U64", "uint32": "U32", "uint16": "U16",
                  "uint8": "U8", "bool": "BOOL"}


class SafetensorsError(ValueError):
    """A safetensors file is malformed; the message names the file and the field."""


@dataclass(frozen=True)
class SafeTensorInfo:
    """One tensor's entry: dtype name, shape, byte range within the data section."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


def _fail(path: Path, what: str) -> SafetensorsError:
    return SafetensorsError(f"{path}: {what}")


class SafetensorsFile:
    """A parsed safetensors file: ``tensors`` (infos), ``metadata`` (str -> str), and the data."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            raise FileNotFoundError(f"safetensors file not found: {self.path}") from None
        if size < 8:
            raise _fail(self.path, f"only {size} bytes; the header length alone takes 8 (truncated?)")
        with open(self.path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if n > min(MAX_HEADER_BYTES, size - 8):
                raise _fail(self.path, f"header length {n} exceeds the file ({size} bytes) or the {MAX_HEADER_BYTES}-byte limit")
            raw = f.read(n)
        try:
            header = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise _fail(self.path, f"header is not valid UTF-8 JSON ({e})") from None
        except RecursionError:  # "[[[[..." deeper than the parser's stack: no header is like that
            raise _fail(self.path, "header is JSON nested too deeply to be a safetensors header") from None
        if not isinstance(header, dict):
            raise _fail(self.path, f"header must be a JSON object, got {type(header).__name__}")
        meta = header.pop("__metadata__", {}) or {}
        if not isinstance(meta, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()):
            raise _fail(self.path, "__metadata__ must map strings to strings")
        self.metadata: dict[str, str] = meta
        self.data_offset = 8 + n
        data_size = size - self.data_offset
        self.tensors: dict[str, SafeTensorInfo] = {}
        for name, entry in header.items():
            self.tensors[name] = self._check_entry(name, entry, data_size)
        spans = sorted((t.begin, t.end, t.name) for t in self.tensors.values())
        position = 0
        for begin, end, name in spans:
            if begin < position:
                raise _fail(self.path, f"tensor {name!r} overlaps the tensor before it")
            if begin > position:
                raise _fail(self.path, f"{begin - position} unindexed bytes before tensor {name!r} (holes are not allowed)")
            position = end
        if position != data_size:
            raise _fail(self.path, f"the data section has {data_size} bytes but the tensors index {position}")
        self._mmap = None
        if data_size:
            with open(self.path, "rb") as f:
                self._mmap = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)

    def _check_entry(self, name: str, entry: object, data_size: int) -> SafeTensorInfo:
        if not isinstance(entry, dict):
            raise _fail(self.path, f"entry {name!r} is not an object")
        dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
        if dtype not in DTYPES:
            raise _fail(self.path, f"tensor {name!r}: unknown dtype {dtype!r} (known: {', '.join(DTYPES)})")
        if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
            raise _fail(self.path, f"tensor {name!r}: shape must be a list of non-negative integers, got {shape!r}")
        if (
            not isinstance(offsets, list) or len(offsets) != 2
            or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
        ):
            raise _fail(self.path, f"tensor {name!r}: data_offsets must be [begin, end], got {offsets!r}")
        begin, end = offsets
        if not 0 <= begin <= end <= data_size:
            raise _fail(self.path, f"tensor {name!r}: data_offsets {offsets} fall outside the {data_size}-byte data section")
        n = int(np.prod(shape, dtype=object)) if shape else 1
        if end - begin != n * DTYPES[dtype][1]:
            raise _fail(self.path, f"tensor {name!r}: {end - begin} bytes for {dtype} {shape}, which needs {n * DTYPES[dtype][1]}")
        return SafeTensorInfo(name, dtype, tuple(shape), begin, end)

    def tensor(self, name: str) -> np.ndarray:
        """Tensor ``name`` as a read-only NumPy view of the file (BF16 comes as uint16 bits)."""
        try:
            info = self.tensors[name]
        except KeyError:
            raise KeyError(f"no tensor named {name!r} in {self.path}") from None
        dtype, _ = DTYPES[info.dtype]
        count = (info.end - info.begin) // np.dtype(dtype).itemsize
        if count == 0:
            return np.zeros(info.shape, dtype=dtype)
        return np.frombuffer(self._mmap, dtype=dtype, count=count, offset=self.data_offset + info.begin).reshape(info.shape)

    def to_float32(self, name: str) -> np.ndarray:
        """Tensor ``name`` as float32 (BF16 widened by shifting its bits into the top half)."""
        arr = self.tensor(name)
        if self.tensors[name].dtype == "BF16":
            return (arr.astype(np.uint32) << 16).view(np.float32)
        return arr.astype(np.float32)

    def close(self) -> None:
        if self._mmap is not None:
            try:
                self._mmap.close()
            except BufferError:
                pass  # views still alive; freed with them
            self._mmap = None

    def __enter__(self) -> SafetensorsFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_safetensors(path: str | os.PathLike[str]) -> SafetensorsFile:
    """Open and validate a safetensors file."""
    return SafetensorsFile(path)


def write_safetensors(
    path: str | os.PathLike[str], tensors: Mapping[str, np.ndarray], metadata: Mapping[str, str] | None = None
) -> None:
    """Write ``tensors`` (NumPy arrays) and string ``metadata``; via a temporary file and a rename.

    Tensors are stored in the order given, contiguous, little-endian; the
    header is padded with spaces to a multiple of 8 bytes so the data is aligned.
    """
    header: dict[str, object] = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    offset = 0
    blobs = []
    for name, array in tensors.items():
        a = np.ascontiguousarray(array)
        if a.dtype.name not in _NUMPY_TO_NAME:
            raise TypeError(f"tensor {name!r}: dtype {a.dtype} has no safetensors name")
        blob = a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes()
        header[name] = {"dtype": _NUMPY_TO_NAME[a.dtype.name], "shape": list(a.shape),
                        "data_offsets": [offset, offset + len(blob)]}
        offset += len(blob)
        blobs.append(blob)
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)
    from ..files import atomic_write

    with atomic_write(path) as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for blob in blobs:
            f.write(blob)
