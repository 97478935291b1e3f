"""install_on_cupy's wiring, against a stand-in for the few ``cupy.cuda`` names it uses (CPU only).

The real thing needs a GPU (``scripts/gpu_check.py`` calls it there); this checks what can be
checked without one: CuPy's allocator hook gets blocks from our pool, a block goes back to the
pool when CuPy drops its memory, an out-of-memory status becomes the pool's retry path, and
uninstall restores CuPy's pool.
"""

from __future__ import annotations

import gc
from types import SimpleNamespace

import pytest

from llmrs_core.labs.fake_device import FakeDevice
from llmrs_core.labs.memory_pool import OutOfMemoryError
from llmrs_core.labs.memory_pool_cupy import CUDA_ERROR_MEMORY_ALLOCATION, install_on_cupy

MiB = 1024 * 1024


class CUDARuntimeError(RuntimeError):
    def __init__(self, status: int) -> None:
        super().__init__(f"status {status}")
        self.status = status


def fake_cupy(capacity: int):
    device = FakeDevice(capacity, keep_bytes=False)

    def malloc(n):
        try:
            return device.malloc(n)
        except MemoryError:
            raise CUDARuntimeError(CUDA_ERROR_MEMORY_ALLOCATION) from None

    class UnownedMemory:
        def __init__(self, ptr, size, owner, device_id):
            self.ptr, self.size, self.owner, self.device_id = ptr, size, owner, device_id

    class MemoryPointer:
        def __init__(self, mem, offset):
            self.mem, self.ptr = mem, mem.ptr + offset

    class Event:
        def __init__(self, disable_timing=False):
            self.done = False

        def record(self, stream):
            self.stream = stream

        def synchronize(self):
            self.done = True

    state = SimpleNamespace(allocator=None, current=SimpleNamespace(ptr=0))
    cuda = SimpleNamespace(
        runtime=SimpleNamespace(
            malloc=malloc, free=device.free, memGetInfo=device.mem_info, getDevice=lambda: 0,
            CUDARuntimeError=CUDARuntimeError,
        ),
        UnownedMemory=UnownedMemory, MemoryPointer=MemoryPointer, Event=Event,
        get_current_stream=lambda: state.current,
        set_allocator=lambda f: setattr(state, "allocator", f),
    )  # fmt: skip
    default_pool = SimpleNamespace(malloc=object())
    return SimpleNamespace(cuda=cuda, get_default_memory_pool=lambda: default_pool), device, state


def test_cupy_allocations_come_from_the_pool_and_return_when_dropped():
    cupy, device, state = fake_cupy(64 * MiB)
    handle = install_on_cupy(cupy=cupy)
    memptr = state.allocator(1000)
    assert handle.pool.block_size(memptr.ptr) == 1024 and memptr.mem.size == 1000
    assert handle.pool.stats().allocated_bytes == 1024 and list(device.live.values()) == [2 * MiB]
    del memptr
    gc.collect()
    assert handle.pool.stats().allocated_bytes == 0, "dropping CuPy's memory frees the block"
    assert state.allocator(1000).mem.size == 1000 and handle.pool.stats().num_cache_hits == 1


def test_cupy_streams_are_told_apart_and_record_stream_records_an_event():
    cupy, _, state = fake_cupy(64 * MiB)
    handle = install_on_cupy(cupy=cupy)
    first = state.allocator(512)
    state.current = SimpleNamespace(ptr=0xABC)
    other = state.allocator(512)
    assert [s.stream for s in handle.pool.snapshot()] == [0, 0xABC]
    handle.record_stream(SimpleNamespace(data=first), state.current)
    del first
    gc.collect()
    assert [b.state for b in handle.pool.snapshot()[0].blocks][0] == "pending"
    del other


def test_cupy_out_of_memory_goes_through_the_retry_and_uninstall_restores_cupy():
    cupy, device, state = fake_cupy(22 * MiB)
    handle = install_on_cupy(cupy=cupy)
    held = state.allocator(11 * MiB)
    with pytest.raises(OutOfMemoryError, match="tried to allocate 11.00 MiB"):
        state.allocator(11 * MiB)
    assert handle.pool.stats().num_cache_flushes == 1
    del held
    gc.collect()
    handle.uninstall()
    assert state.allocator is cupy.get_default_memory_pool().malloc and device.live == {}
