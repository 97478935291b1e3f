"""Chapter 9 solutions: the engine's GPU kernels and memory pool (llmrs_core.kernels.gpu)."""

from __future__ import annotations

import dataclasses

from llmrs_core.labs.memory_pool import (
    PYTORCH_CONFIG,
    CachingAllocator,
    DeviceAllocator,
    PoolConfig,
    is_small,
    round_size,
    segment_size,
    should_split,
)

__all__: list[str] = []  # each exercise's region adds its names

# -- Exercise 9.7 ---------------------------------------------------------------------

from llmrs_core.kernels.gpu import elementwise, matvec  # noqa: E402  (these import numba.cuda)

__all__ += ["launch_rms_norm"]


def launch_rms_norm(x, weight, eps: float, out) -> None:
    """The engine's RMSNorm kernel (``kernels.gpu.elementwise.rms_norm``): a block per row."""
    elementwise.rms_norm_rows(x, weight, eps, out=out)


# -- Exercise 9.8 ---------------------------------------------------------------------

__all__ += ["launch_q4_1_matvec"]


def launch_q4_1_matvec(qs, d, m, x, out) -> None:
    """The engine's fused Q4_1 kernel (``kernels.gpu.matvec.q4_1_matvec``) on these blocks."""
    rows, half = qs.shape
    matvec.matvec(x, matvec.DeviceMatrix("q4_1", rows, 2 * half, qs, d, m), out=out)


# -- Exercise 9.9 ---------------------------------------------------------------------

__all__ += [
    "DeviceAllocator",
    "MemoryPool",
    "PoolConfig",
    "is_small",
    "round_size",
    "segment_size",
    "should_split",
]

_STATS = (
    "allocated_bytes",
    "peak_allocated_bytes",
    "reserved_bytes",
    "peak_reserved_bytes",
    "num_allocs",
    "num_frees",
    "num_cache_hits",
    "num_segments",
)


class MemoryPool:
    """The engine's :class:`CachingAllocator` on one stream, seen through the exercise's interface."""

    def __init__(self, device: DeviceAllocator, config: PoolConfig = PYTORCH_CONFIG) -> None:
        self._pool = CachingAllocator(device, config=config)

    def malloc(self, nbytes: int) -> int:
        return self._pool.malloc(nbytes)

    def free(self, ptr: int) -> None:
        self._pool.free(ptr)

    def stats(self) -> dict[str, int]:
        stats = dataclasses.asdict(self._pool.stats())
        return {k: stats[k] for k in _STATS}

    def segments(self) -> list[list[tuple[int, int, bool]]]:
        return [[(b.ptr, b.size, b.state == "allocated") for b in s.blocks] for s in self._pool.snapshot()]
