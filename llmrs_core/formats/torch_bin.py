"""Loading PyTorch ``.bin`` checkpoints without executing code (chapter 10).

``torch.save`` writes a zip archive: ``<name>/data.pkl`` is a pickle of the
state dict, and ``<name>/data/<key>`` holds each storage's raw bytes. A
pickle is a little program: its GLOBAL and REDUCE opcodes import any
callable and call it, so ``torch.load`` on an untrusted file can run
arbitrary code. We unpickle with an allow-list: only the handful of names a
plain state dict needs (``OrderedDict``, the storage types,
``torch._utils._rebuild_tensor_v2`` and ``_rebuild_parameter``) resolve, each
to our own NumPy stand-in, and anything else stops the load with an
``UnsafeCheckpointError`` naming it. The result is a dict of NumPy arrays.
"""

from __future__ import annotations

import _compat_pickle
import collections
import os
import pickle
import zipfile
from pathlib import Path
from typing import Any

import numpy as np


class UnsafeCheckpointError(pickle.UnpicklingError):
    """The checkpoint asks to import something other than tensors: refused, nothing was run."""


class _Storage:
    """A storage type of the pickle, standing for its NumPy dtype."""

    def __init__(self, name: str, dtype: str):
        self.name, self.dtype = name, dtype

    def __repr__(self) -> str:
        return f"torch.{self.name}"


STORAGE_DTYPES = {
    "FloatStorage": "<f4", "DoubleStorage": "<f8", "HalfStorage": "<f2", "BFloat16Storage": "<u2",
    "LongStorage": "<i8", "IntStorage": "<i4", "ShortStorage": "<i2", "CharStorage": "i1",
    "ByteStorage": "u1", "BoolStorage": "?",
}


def _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad=False, backward_hooks=None,
                       metadata=None) -> np.ndarray:
    """A tensor is a strided view of a storage: ``size``/``stride`` count elements."""
    array, is_bf16 = storage
    if len(size) == 0:
        out = np.array(array[storage_offset])
    else:
        item = array.itemsize
        needed = storage_offset + sum((n - 1) * s for n, s in zip(size, stride)) + 1
        if any(n == 0 for n in size):
            out = np.zeros(size, dtype=array.dtype)
        elif needed > array.size or storage_offset < 0 or any(s < 0 for s in stride):
            raise pickle.UnpicklingError(f"tensor view {size}/{stride}+{storage_offset} runs past its storage")
        else:
            out = np.lib.stride_tricks.as_strided(
                array[storage_offset:], shape=tuple(size), strides=tuple(s * item for s in stride)
            ).copy()
    return (out.astype(np.uint32) << 16).view(np.float32) if is_bf16 else out


def _rebuild_parameter(data, requires_grad=False, backward_hooks=None) -> np.ndarray:
    return data


ALLOWED: dict[tuple[str, str], Any] = {
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor_v2,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    **{("torch", name): _Storage(name, dtype) for name, dtype in STORAGE_DTYPES.items()},
}


class _RestrictedUnpickler(pickle.Unpickler):
    def __init__(self, file, archive: zipfile.ZipFile, prefix: str):
        super().__init__(file)
        self.archive, self.prefix = archive, prefix
        self.storages: dict[str, tuple[np.ndarray, bool]] = {}

    def find_class(self, module: str, name: str) -> Any:
        # protocol-2 pickles (torch's default) name Python 2 modules: __builtin__ for builtins
        module, name = _compat_pickle.NAME_MAPPING.get((module, name), (module, name))
        module = _compat_pickle.IMPORT_MAPPING.get(module, module)
        try:
            return ALLOWED[(module, name)]
        except KeyError:
            raise UnsafeCheckpointError(
                f"refusing to load: the checkpoint wants {module}.{name}, which is not a tensor "
                "building block — loading it would run code from the file"
            ) from None

    def persistent_load(self, pid: Any) -> tuple[np.ndarray, bool]:
        if not (isinstance(pid, tuple) and len(pid) >= 5 and pid[0] == "storage" and isinstance(pid[1], _Storage)):
            raise pickle.UnpicklingError(f"unexpected persistent id {pid!r}")
        storage_type, key, numel = pid[1], str(pid[2]), pid[4]
        if key not in self.storages:
            try:
                raw = self.archive.read(f"{self.prefix}data/{key}")
            except KeyError:
                raise pickle.UnpicklingError(f"storage {key} is missing from the archive") from None
            array = np.frombuffer(raw, dtype=storage_type.dtype)
            if array.size < numel:
                raise pickle.UnpicklingError(f"storage {key} holds {array.size} elements, the pickle says {numel}")
            self.storages[key] = (array, storage_type.name == "BFloat16Storage")
        return self.storages[key]


def load_torch_bin(path: str | os.PathLike[str]) -> dict[str, np.ndarray]:
    """A PyTorch zip checkpoint's state dict as NumPy arrays, without running any of its code.

    Raises ``UnsafeCheckpointError`` for a pickle that reaches for anything
    but tensors, ``ValueError`` for a file that is not a zip checkpoint (the
    pre-1.6 legacy format is refused too).
    """
    path = Path(path)
    try:
        archive = zipfile.ZipFile(path)
    except zipfile.BadZipFile:
        raise ValueError(f"{path}: not a zip-format PyTorch checkpoint (legacy .bin files are not supported)") from None
    with archive:
        pickles = [n for n in archive.namelist() if n.endswith("data.pkl")]
        if len(pickles) != 1:
            raise ValueError(f"{path}: expected one data.pkl in the archive, found {len(pickles)}")
        prefix = pickles[0][: -len("data.pkl")]
        byteorder = f"{prefix}byteorder"
        if byteorder in archive.namelist() and archive.read(byteorder).strip() != b"little":
            raise ValueError(f"{path}: big-endian checkpoints are not supported")
        with archive.open(pickles[0]) as f:
            state = _RestrictedUnpickler(f, archive, prefix).load()
    if not isinstance(state, dict):
        raise ValueError(f"{path}: the checkpoint holds a {type(state).__name__}, not a state dict")
    bad = [k for k, v in state.items() if not isinstance(v, np.ndarray)]
    if bad:
        raise ValueError(f"{path}: entries that are not tensors: {bad[:5]}")
    return dict(state)
