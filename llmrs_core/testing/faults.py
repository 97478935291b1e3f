"""Fault injection for the server's tests and chapter 12.3's notebook: a backend that fails or stalls.

:class:`FaultyBackend` wraps a model's backend and does every operation with it,
except that it counts forward passes — ``Backend.begin_step`` is called once per
pass — and, at the passes it is told to, raises :class:`InjectedFault` or sleeps.
:func:`inject_faults` puts one into a loaded model (its weights stay the inner
backend's)::

    model = llmrs.load(path, backend="numpy")
    faults = inject_faults(model, fail_at=3, fail_for=None)   # pass 3 and every one after: a dead device

Passes are numbered from 1, counting from the wrap. Note that when a batched pass
raises, the engine runs each sequence of the batch alone to find the culprit
(``Engine._forward_isolated``): a fault of ``fail_for=1`` in a batch of several is
absorbed by that retry, while one in a batch of one fails its request, and a
lasting fault (``fail_for=None``) fails every request of the step.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ..attention import PLAIN, AttentionOptions
from ..backends.base import Backend
from ..sampling import SamplingParams


class InjectedFault(RuntimeError):
    """The error a :class:`FaultyBackend` raises (a stand-in for a device or kernel failure)."""


class FaultyBackend(Backend):
    """``inner`` with injected faults.

    Args:
        inner: the backend that computes.
        fail_at: the first forward pass that raises :class:`InjectedFault` (``None``: none).
        fail_for: how many passes from ``fail_at`` raise (``None``: every one after it).
        stall_at: a forward pass that blocks in ``begin_step`` until :meth:`release` is called,
            or ``stall_s`` seconds pass (a bound, so that a test can never hang on it).
        pass_delay_s: seconds every pass sleeps first (a slow device: requests stay in flight).
    """

    def __init__(self, inner: Backend, fail_at: int | None = None, fail_for: int | None = 1,
                 stall_at: int | None = None, stall_s: float = 60.0, pass_delay_s: float = 0.0):
        for what, value in (("fail_at", fail_at), ("fail_for", fail_for), ("stall_at", stall_at)):
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{what} must be a pass number >= 1 or None, got {value!r}")
        self.inner = inner
        self.name = f"faulty({inner.name})"
        self.xp = inner.xp
        self.rope_layout = inner.rope_layout
        self.warm_up_sizes = inner.warm_up_sizes
        self.fail_at, self.fail_for = fail_at, fail_for
        self.stall_at, self.stall_s = stall_at, stall_s
        self.pass_delay_s = pass_delay_s
        self._released = threading.Event()
        self._lock = threading.Lock()
        #: forward passes begun so far
        self.passes = 0
        #: passes that raised
        self.faults = 0
        #: set while a stalled pass is blocked
        self.stalling = threading.Event()

    def failing(self, n: int) -> bool:
        """Whether pass ``n`` raises."""
        if self.fail_at is None or n < self.fail_at:
            return False
        return self.fail_for is None or n < self.fail_at + self.fail_for

    def release(self) -> None:
        """Let a stalled pass return."""
        self._released.set()

    def begin_step(self, n_tokens: int, sizes: tuple[int, ...] = ()) -> None:
        with self._lock:
            self.passes += 1
            n = self.passes
        if self.pass_delay_s:
            time.sleep(self.pass_delay_s)
        if n == self.stall_at:
            self.stalling.set()
            self._released.wait(self.stall_s)
            self.stalling.clear()
        if self.failing(n):
            self.faults += 1
            raise InjectedFault(f"injected fault in forward pass {n} ({n_tokens} tokens)")
        self.inner.begin_step(n_tokens, sizes)

    # -- everything else is the inner backend's ---------------------------------------------

    def prepare(self, source: Any) -> None:
        self.inner.prepare(source)
        self.rope_layout = self.inner.rope_layout

    def to_host(self, x: Any) -> np.ndarray:
        return self.inner.to_host(x)

    def load_matrix(self, source: Any, name: str) -> Any:
        return self.inner.load_matrix(source, name)

    def load_matrices(self, source: Any, names: list[str]) -> list[Any]:
        return self.inner.load_matrices(source, names)

    def matmul_many(self, x: np.ndarray, ws: list[Any]) -> list[np.ndarray]:
        return self.inner.matmul_many(x, ws)

    def load_vector(self, source: Any, name: str) -> np.ndarray:
        return self.inner.load_vector(source, name)

    def embed(self, table: Any, ids: np.ndarray) -> np.ndarray:
        return self.inner.embed(table, ids)

    def matmul(self, x: np.ndarray, w: Any) -> np.ndarray:
        return self.inner.matmul(x, w)

    def rms_norm(self, x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
        return self.inner.rms_norm(x, weight, eps)

    def swiglu(self, gate: np.ndarray, up: np.ndarray) -> np.ndarray:
        return self.inner.swiglu(gate, up)

    def rope(self, x: np.ndarray, positions: np.ndarray, theta: float) -> np.ndarray:
        return self.inner.rope(x, positions, theta)

    def rope_frequencies(self, x: np.ndarray, positions: np.ndarray, freqs: np.ndarray) -> np.ndarray:
        return self.inner.rope_frequencies(x, positions, freqs)

    def geglu(self, gate: np.ndarray, up: np.ndarray) -> np.ndarray:
        return self.inner.geglu(gate, up)

    def attention(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, options: AttentionOptions = PLAIN) -> np.ndarray:
        return self.inner.attention(q, k, v, options)

    def paged_decode_attention(self, q: Any, k_pool: Any, v_pool: Any, tables: np.ndarray, lengths: np.ndarray,
                               options: AttentionOptions = PLAIN) -> Any:
        return self.inner.paged_decode_attention(q, k_pool, v_pool, tables, lengths, options)

    def sampler(self, params: SamplingParams) -> Callable[..., int]:
        return self.inner.sampler(params)


    def describe(self) -> str:
        return f"{self.inner.describe()} with injected faults"


def inject_faults(model: Any, **faults: Any) -> FaultyBackend:
    """Wrap ``model``'s backend (a :class:`~llmrs_core.loader.Model` from ``llmrs.load``) in a
    :class:`FaultyBackend` with ``faults`` (its keyword arguments); returns the wrapper."""
    network = model.network
    wrapper = FaultyBackend(network.backend, **faults)
    network.backend = wrapper
    return wrapper


__all__ = ["FaultyBackend", "InjectedFault", "inject_faults"]
