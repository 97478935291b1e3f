"""The caching allocator behind CuPy's arrays, on a real GPU (chapter 9, §9.4).

For ``scripts/gpu_check.py``::

    from llmrs_core.labs.memory_pool_cupy import install_on_cupy
    handle = install_on_cupy()        # every CuPy allocation now goes through our pool
    ...                               # run the workload
    print(handle.pool.stats())        # allocated/reserved bytes, cache hits, segments
    handle.uninstall()                # CuPy's own allocator again (our cache is emptied)

or, all of that with values checked on two streams: ``stats = check_on_gpu()``.

Pieces: :class:`CupyDevice` is the :class:`~llmrs_core.labs.memory_pool.DeviceAllocator`
(``cudaMalloc``/``cudaFree``/``cudaMemGetInfo`` through ``cupy.cuda.runtime``);
:class:`CupyEvents` records ``cudaEvent``\\ s on streams known by their handle; and
``allocate(nbytes)`` wraps a pool block in ``cupy.cuda.UnownedMemory`` whose owner gives the
block back to the pool (:meth:`CachingAllocator.free_later`) when CuPy drops the last
reference to it. Streams are keyed by their ``cudaStream_t`` handle (``stream.ptr``), the one
CuPy makes current with ``with stream:``. Needs a GPU: nothing here runs on the CPU.
"""

from __future__ import annotations

import dataclasses
import gc
import weakref
from dataclasses import dataclass
from typing import Any

from llmrs_core.labs.memory_pool import (
    PYTORCH_CONFIG,
    CachingAllocator,
    DeviceMallocError,
    MiB,
    PoolConfig,
)

CUDA_ERROR_MEMORY_ALLOCATION = 2  # cudaErrorMemoryAllocation


class CupyDevice:
    """Raw device memory through ``cupy.cuda.runtime`` (a ``DeviceAllocator``)."""

    def __init__(self, cupy: Any) -> None:
        self.runtime = cupy.cuda.runtime

    def malloc(self, nbytes: int) -> int:
        try:
            return int(self.runtime.malloc(nbytes))
        except self.runtime.CUDARuntimeError as e:
            if e.status == CUDA_ERROR_MEMORY_ALLOCATION:
                raise DeviceMallocError(str(e)) from e
            raise

    def free(self, ptr: int) -> None:
        self.runtime.free(ptr)

    def mem_info(self) -> tuple[int, int]:
        free, total = self.runtime.memGetInfo()
        return int(free), int(total)


class _CupyEvent:
    def __init__(self, event: Any) -> None:
        self.event = event

    def query(self) -> bool:
        return bool(self.event.done)

    def synchronize(self) -> None:
        self.event.synchronize()


class CupyEvents:
    """Records CUDA events on streams named by their handle (an ``EventSource``)."""

    def __init__(self, cupy: Any) -> None:
        self.cupy = cupy
        self.streams: dict[int, Any] = {}  # handle -> the Stream object, kept alive while in use

    def key(self, stream: Any) -> int:
        """The pool's name for a CuPy stream (its handle); remembers the stream for events."""
        self.streams[stream.ptr] = stream
        return stream.ptr

    def record(self, stream: int) -> _CupyEvent:
        event = self.cupy.cuda.Event(disable_timing=True)
        event.record(self.streams[stream])
        return _CupyEvent(event)


@dataclass
class CupyPoolHandle:
    """What :func:`install_on_cupy` installed: the pool, and how to take it out again."""

    pool: CachingAllocator
    events: CupyEvents
    cupy: Any

    def record_stream(self, array: Any, stream: Any) -> None:
        """``array`` (allocated while the pool was installed) is also used on ``stream``."""
        self.pool.record_stream(array.data.mem.ptr, self.events.key(stream))

    def uninstall(self) -> None:
        """Give CuPy its own memory pool back and return our cached segments to the device."""
        self.cupy.cuda.set_allocator(self.cupy.get_default_memory_pool().malloc)
        self.pool.empty_cache()


def install_on_cupy(config: PoolConfig = PYTORCH_CONFIG, cupy: Any = None) -> CupyPoolHandle:
    """Route every CuPy allocation on the current device through a new :class:`CachingAllocator`.

    ``cupy`` defaults to the installed CuPy (the argument exists for tests). Arrays allocated
    before the call keep CuPy's own pool; arrays allocated after it return their blocks to
    ours when they die, even after :meth:`CupyPoolHandle.uninstall`.
    """
    if cupy is None:
        import cupy
    device_id = cupy.cuda.runtime.getDevice()
    events = CupyEvents(cupy)
    pool = CachingAllocator(CupyDevice(cupy), events, config)

    def allocate(nbytes: int) -> Any:
        ptr = pool.malloc(nbytes, events.key(cupy.cuda.get_current_stream()))
        owner = _Owner()
        weakref.finalize(owner, pool.free_later, ptr)  # runs when CuPy drops the memory
        memory = cupy.cuda.UnownedMemory(ptr, nbytes, owner, device_id)
        return cupy.cuda.MemoryPointer(memory, 0)

    cupy.cuda.set_allocator(allocate)
    return CupyPoolHandle(pool, events, cupy)


class _Owner:
    """Kept alive by ``UnownedMemory``; its finaliser frees the block."""


def check_on_gpu(steps: int = 100) -> dict[str, int]:
    """For ``scripts/gpu_check.py``: CuPy work through the pool on two streams, values checked.

    Each step makes decode-sized arrays (hidden ``[8, 576]``, logits ``[8, 49152]``) on the
    current stream and a product on a side stream (declared with ``record_stream``); every
    tenth step keeps a 3 MiB array, read back at the end. Raises ``AssertionError`` on a wrong
    value; returns the pool's stats (as a dict) before it is uninstalled.
    """
    import cupy

    handle = install_on_cupy()
    try:
        side = cupy.cuda.Stream(non_blocking=True)
        kept = []
        for step in range(steps):
            hidden = cupy.full((8, 576), step, dtype=cupy.float32)
            logits = cupy.ones((8, 49152), dtype=cupy.float32)
            if step % 10 == 0:
                kept.append(cupy.full(3 * MiB // 4, step, dtype=cupy.float32))
            side.wait_event(cupy.cuda.get_current_stream().record())  # hidden is filled before side reads it
            with side:
                doubled = hidden * 2
            handle.record_stream(hidden, side)
            side.synchronize()
            assert float(doubled[7, 575]) == 2 * step and float(logits.sum()) == 8 * 49152, step
            del hidden, logits, doubled
        for i, array in enumerate(kept):
            assert float(array[0]) == float(array[-1]) == 10 * i, (
                f"a kept 3 MiB array changed (step {10 * i})"
            )
        del kept
        gc.collect()
        cupy.cuda.Device().synchronize()
        return dataclasses.asdict(handle.pool.stats())
    finally:
        handle.uninstall()


__all__ = ["CupyDevice", "CupyEvents", "CupyPoolHandle", "check_on_gpu", "install_on_cupy"]
