"""The KV cache (introduced in chapter 4; chapter 5 makes it a subsystem of its own).

Generation computes each token's keys and values once and keeps them: the
next step's queries attend to all of them. Layout, per layer:
``[n_kv_heads, max_tokens, head_dim]`` — one contiguous run of positions per
head, so a head's keys are read in order by the attention of one query.
"""

from __future__ import annotations

from types import ModuleType

import numpy as np

from ..config import ModelConfig
from ..memory import check_host_allocation
from .base import KVCache


class CacheFullError(RuntimeError):
    """The sequence would grow past the cache's ``max_tokens``."""


class ContiguousKVCache(KVCache):
    """Preallocated K and V for one sequence: ``k[layer]`` is ``[Hkv, max_tokens, D]`` float32.

    The model writes a layer's new K/V with :meth:`write` and reads all of
    them with :meth:`view`; after every layer is done it calls
    :meth:`advance`, so ``length`` is the number of cached positions.
    ``xp`` is the array module the storage lives in (the backend's: NumPy, or
    CuPy for a GPU backend).
    """

    def __init__(self, config: ModelConfig, max_tokens: int, dtype: type = np.float32, xp: ModuleType = np):
        if max_tokens <= 0:
            raise ValueError(f"max_tokens must be positive, got {max_tokens}")
        shape = (config.n_layers, config.n_kv_heads, max_tokens, config.head_dim)
        if xp is np:  # a GPU backend's array module checks its own memory
            nbytes = 2 * int(np.prod(shape, dtype=np.float64)) * np.dtype(dtype).itemsize
            check_host_allocation(nbytes, f"a KV cache of {max_tokens:,} tokens")
        self.k = xp.zeros(shape, dtype=dtype)
        self.v = xp.zeros(shape, dtype=dtype)
        self.max_tokens = max_tokens
        self.length = 0

    def write(self, layer: int, k: np.ndarray, v: np.ndarray) -> None:
        """Store ``k, v [T, Hkv, D]`` at positions ``length .. length + T - 1`` of ``layer``."""
        t = k.shape[0]
        if self.length + t > self.max_tokens:
            raise CacheFullError(
                f"KV cache holds {self.max_tokens} tokens; {self.length} used, {t} more do not fit"
            )
        self.k[layer, :, self.length : self.length + t] = k.transpose(1, 0, 2)
        self.v[layer, :, self.length : self.length + t] = v.transpose(1, 0, 2)

    def view(self, layer: int, n_new: int) -> tuple[np.ndarray, np.ndarray]:
        """K and V of all positions including the ``n_new`` just written, as ``[Tk, Hkv, D]`` views."""
        end = self.length + n_new
        return self.k[layer, :, :end].transpose(1, 0, 2), self.v[layer, :, :end].transpose(1, 0, 2)

    def advance(self, n_new: int) -> None:
        self.length += n_new

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes
