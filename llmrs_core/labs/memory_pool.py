"""A caching GPU memory allocator, modelled on PyTorch's ``CUDACachingAllocator`` (chapter 9, §9.4, Exercise 9.9).

``cudaMalloc`` is slow (it may synchronise the device) and ``cudaFree`` always synchronises,
so an engine that allocates per step asks the device once and then recycles: freed blocks go
back to a cache, not to the driver.

The rules are PyTorch's: requests rounded up to 512 bytes; a small pool (<= 1 MiB, from
2 MiB segments) and a large one (20 MiB segments, or a segment of its own from 10 MiB on);
best fit per (pool, stream) by (size, address); splitting and coalescing; a block reused
across streams only after :meth:`CachingAllocator.record_stream`'s events complete; on out
of memory, free cached segments and retry once, then :class:`OutOfMemoryError` naming the
request and the allocated, reserved and device-free bytes; ``empty_cache``. Each rule with
its constants and reasons: chapter 9.4 ("The caching allocator's rules").

The device is reached only through the :class:`DeviceAllocator` protocol, and streams'
events through :class:`EventSource`, so the whole pool is tested on the CPU with a fake
address space (``tests/core/test_gpu_memory_pool.py``) and plugged into CuPy on a GPU by
:func:`llmrs_core.labs.memory_pool_cupy.install_on_cupy`. Every operation holds the pool's
lock, so threads may share a pool; a finaliser must call :meth:`CachingAllocator.free_later`
instead of ``free``, since it may run on a thread that is already inside the pool.
"""

from __future__ import annotations

import bisect
import collections
import threading
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Protocol

KiB, MiB = 1024, 1024 * 1024
DEFAULT_STREAM: Hashable = 0  # the legacy default stream's handle, as CUDA writes it


class DeviceMallocError(MemoryError):
    """Raised by a :class:`DeviceAllocator` when the device cannot supply the bytes asked for."""


class OutOfMemoryError(MemoryError):
    """The pool could not find or make room for a request, even after emptying its cache."""


class DeviceAllocator(Protocol):
    """Raw device memory: ``cudaMalloc``/``cudaFree``/``cudaMemGetInfo`` or a fake of them."""

    def malloc(self, nbytes: int) -> int:
        """Address of ``nbytes`` fresh bytes; :class:`DeviceMallocError` when there is no room."""
        ...

    def free(self, ptr: int) -> None:
        """Give back memory that :meth:`malloc` returned."""
        ...

    def mem_info(self) -> tuple[int, int]:
        """``(free_bytes, total_bytes)`` of the device."""
        ...


class Event(Protocol):
    """A marker recorded on a stream: complete once the work queued before it has run."""

    def query(self) -> bool:
        """True when the work recorded before this event has completed (does not wait)."""
        ...

    def synchronize(self) -> None:
        """Wait until :meth:`query` would be True."""
        ...


class EventSource(Protocol):
    """Records events on streams (``cudaEventRecord``)."""

    def record(self, stream: Hashable) -> Event:
        """A new event recorded now on ``stream``."""
        ...


@dataclass(frozen=True)
class PoolConfig:
    """The size rules (PyTorch's constants by default; tests may scale them down)."""

    min_block: int = 512  # every size is a multiple of this
    small_max: int = 1 * MiB  # requests up to this are small
    small_segment: int = 2 * MiB  # the segment size of the small pool
    large_segment: int = 20 * MiB  # the segment for large requests below min_large_alloc
    min_large_alloc: int = 10 * MiB  # from here on a large request gets its own segment
    round_large: int = 2 * MiB  # ... rounded up to a multiple of this
    coalesce: bool = True  # merge a freed block with its free neighbours

    def __post_init__(self) -> None:
        sizes = (self.min_block, self.small_max, self.small_segment, self.large_segment, self.round_large)
        if any(s <= 0 or s % self.min_block for s in sizes):
            raise ValueError(f"every PoolConfig size must be a positive multiple of min_block: {self}")
        if not self.small_max <= self.small_segment:
            raise ValueError(
                f"small_max {self.small_max} must fit in a small segment of {self.small_segment}"
            )
        if not self.small_max < self.min_large_alloc <= self.large_segment:
            raise ValueError(f"need small_max < min_large_alloc <= large_segment: {self}")


PYTORCH_CONFIG = PoolConfig()  # PyTorch's constants


def round_size(nbytes: int, config: PoolConfig = PYTORCH_CONFIG) -> int:
    """``nbytes`` rounded up to a multiple of ``config.min_block`` (at least one block)."""
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
        raise ValueError(f"an allocation size must be a non-negative int of bytes, not {nbytes!r}")
    m = config.min_block
    return max(m, -(-nbytes // m) * m)


def is_small(size: int, config: PoolConfig = PYTORCH_CONFIG) -> bool:
    """Whether a rounded size belongs to the small pool."""
    return size <= config.small_max


def segment_size(size: int, config: PoolConfig = PYTORCH_CONFIG) -> int:
    """Bytes to ask the device for when no cached block fits a rounded ``size``."""
    if is_small(size, config):
        return config.small_segment
    if size < config.min_large_alloc:
        return config.large_segment
    r = config.round_large
    return -(-size // r) * r


def should_split(block_size: int, size: int, config: PoolConfig = PYTORCH_CONFIG) -> bool:
    """Whether a free block of ``block_size`` serving ``size`` keeps its remainder as a free block."""
    remaining = block_size - size
    return remaining >= config.min_block if is_small(size, config) else remaining > config.small_max


def format_bytes(n: int) -> str:
    """``1.50 MiB``-style text for messages."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} bytes"


@dataclass(eq=False)
class _Segment:
    ptr: int
    size: int
    stream: Hashable
    small: bool


@dataclass(eq=False)
class _Block:
    ptr: int
    size: int
    segment: _Segment
    prev: _Block | None = None
    next: _Block | None = None
    allocated: bool = False
    requested: int = 0
    stream_uses: set = field(default_factory=set)


@dataclass(frozen=True)
class BlockInfo:
    """One block of a segment, as :meth:`CachingAllocator.snapshot` reports it."""

    ptr: int
    size: int
    state: str  # "allocated", "free", or "pending" (freed, waiting for other streams' events)


@dataclass(frozen=True)
class SegmentInfo:
    """One segment and its blocks, in address order (like ``torch.cuda.memory_snapshot()``)."""

    ptr: int
    size: int
    stream: Hashable
    pool: str  # "small" or "large"
    blocks: tuple[BlockInfo, ...]


@dataclass(frozen=True)
class PoolStats:
    """Bytes (current and peak) and event counts, as ``torch.cuda.memory_stats`` keeps them."""

    allocated_bytes: int  # bytes of blocks handed out and not yet freed
    peak_allocated_bytes: int
    reserved_bytes: int  # bytes of segments held from the device
    peak_reserved_bytes: int
    requested_bytes: int  # bytes the callers asked for, before rounding, of live allocations
    active_allocations: int
    num_allocs: int  # successful malloc calls
    num_frees: int
    num_cache_hits: int  # mallocs served from a cached block, without a device malloc
    num_segments: int  # segments held now
    num_device_mallocs: int  # segments ever allocated
    num_device_frees: int  # segments ever given back
    num_cache_flushes: int  # times an out-of-memory emptied the cache to retry
    num_ooms: int  # OutOfMemoryError raised


class CachingAllocator:
    """A caching allocator over a :class:`DeviceAllocator` (rules in the module docstring).

    ``malloc(nbytes, stream) -> ptr`` and ``free(ptr)``; ``events`` is needed only for
    :meth:`record_stream`.
    """

    def __init__(
        self, device: DeviceAllocator, events: EventSource | None = None, config: PoolConfig = PYTORCH_CONFIG
    ) -> None:
        self.device, self.events, self.config = device, events, config
        self._blocks: dict[int, _Block] = {}  # every block of every segment, by address
        # (small pool?, stream) -> its free blocks as sorted (size, ptr): best fit is one bisect
        self._free: dict[tuple[bool, Hashable], list[tuple[int, int]]] = {}
        self._segments: dict[int, _Segment] = {}
        self._pending: list[tuple[_Block, list[Event]]] = []
        self._later: collections.deque[int] = collections.deque()
        self._lock = threading.Lock()
        self._allocated = self._peak_allocated = self._reserved = self._peak_reserved = 0
        self._requested = 0
        self._counts = collections.Counter()

    # -- the public operations -------------------------------------------------------

    def malloc(self, nbytes: int, stream: Hashable = DEFAULT_STREAM) -> int:
        """Address of a block of at least ``nbytes`` bytes for use on ``stream``."""
        size = round_size(nbytes, self.config)
        with self._lock:
            self._drain_later()
            self._process_events()
            block = self._find_free(size, stream)
            if block is not None:
                self._counts["cache_hits"] += 1
            else:
                block = self._new_segment(size, stream, nbytes)
            block = self._split(block, size)
            block.allocated, block.requested = True, nbytes
            self._allocated += block.size
            self._peak_allocated = max(self._peak_allocated, self._allocated)
            self._requested += nbytes
            self._counts["allocs"] += 1
            return block.ptr

    def free(self, ptr: int) -> None:
        """Return a block to the cache (to its stream's free list, or pending other streams' events)."""
        with self._lock:
            self._drain_later()
            self._free_locked(ptr)

    def free_later(self, ptr: int) -> None:
        """:meth:`free` for finalisers: never blocks, and is safe in the middle of another call.

        A garbage-collected array may release its memory while this thread is inside
        :meth:`malloc`; then the free is queued and done at the start of the next operation.
        """
        if self._lock.acquire(blocking=False):
            try:
                self._drain_later()
                self._free_locked(ptr)
            finally:
                self._lock.release()
        else:
            self._later.append(ptr)

    def record_stream(self, ptr: int, stream: Hashable) -> None:
        """Declare that ``stream`` uses the live block at ``ptr`` (``Tensor.record_stream``)."""
        with self._lock:
            block = self._live_block(ptr, "record_stream on")
            if self.events is None:
                raise ValueError("record_stream needs an EventSource: CachingAllocator(device, events=...)")
            if stream != block.segment.stream:
                block.stream_uses.add(stream)

    def empty_cache(self) -> None:
        """Wait for pending frees' events, then give every wholly free segment back to the device."""
        with self._lock:
            self._drain_later()
            self._release_cached()

    def block_size(self, ptr: int) -> int:
        """Bytes of the live block at ``ptr`` (the rounded size, or more where it was not split)."""
        with self._lock:
            return self._live_block(ptr, "block_size of").size

    def stats(self) -> PoolStats:
        """The counters now (see :class:`PoolStats`)."""
        with self._lock:
            self._drain_later()
            c = self._counts
            return PoolStats(
                allocated_bytes=self._allocated,
                peak_allocated_bytes=self._peak_allocated,
                reserved_bytes=self._reserved,
                peak_reserved_bytes=self._peak_reserved,
                requested_bytes=self._requested,
                active_allocations=c["allocs"] - c["frees"],
                num_allocs=c["allocs"],
                num_frees=c["frees"],
                num_cache_hits=c["cache_hits"],
                num_segments=len(self._segments),
                num_device_mallocs=c["device_mallocs"],
                num_device_frees=c["device_frees"],
                num_cache_flushes=c["cache_flushes"],
                num_ooms=c["ooms"],
            )

    def reset_peak_stats(self) -> None:
        """Peaks restart from the current values."""
        with self._lock:
            self._peak_allocated, self._peak_reserved = self._allocated, self._reserved

    def snapshot(self) -> list[SegmentInfo]:
        """Every segment with its blocks in address order, segments by address."""
        with self._lock:
            self._drain_later()
            pending = {id(b) for b, _ in self._pending}
            out = []
            for seg in sorted(self._segments.values(), key=lambda s: s.ptr):
                blocks, b = [], self._blocks[seg.ptr]
                while b is not None:
                    state = "allocated" if b.allocated else "pending" if id(b) in pending else "free"
                    blocks.append(BlockInfo(b.ptr, b.size, state))
                    b = b.next
                out.append(
                    SegmentInfo(
                        seg.ptr, seg.size, seg.stream, "small" if seg.small else "large", tuple(blocks)
                    )
                )
            return out

    # -- allocation ------------------------------------------------------------------

    def _find_free(self, size: int, stream: Hashable) -> _Block | None:
        free = self._free.get((is_small(size, self.config), stream))
        if not free:
            return None
        i = bisect.bisect_left(free, (size, -1))
        if i == len(free):
            return None
        _, ptr = free.pop(i)
        return self._blocks[ptr]

    def _new_segment(self, size: int, stream: Hashable, nbytes: int) -> _Block:
        seg_size = segment_size(size, self.config)
        try:
            ptr = self.device.malloc(seg_size)
        except DeviceMallocError:
            self._counts["cache_flushes"] += 1
            self._release_cached()
            try:
                ptr = self.device.malloc(seg_size)
            except DeviceMallocError:
                self._counts["ooms"] += 1
                raise OutOfMemoryError(self._oom_message(nbytes, size, seg_size)) from None
        self._counts["device_mallocs"] += 1
        seg = _Segment(ptr, seg_size, stream, is_small(size, self.config))
        self._segments[ptr] = seg
        self._reserved += seg_size
        self._peak_reserved = max(self._peak_reserved, self._reserved)
        block = _Block(ptr, seg_size, seg)
        self._blocks[ptr] = block
        return block

    def _oom_message(self, nbytes: int, size: int, seg_size: int) -> str:
        free, total = self.device.mem_info()
        return (
            f"out of GPU memory: tried to allocate {format_bytes(nbytes)} ({nbytes} bytes, rounded to {size}; "
            f"a new segment of {format_bytes(seg_size)} was needed). The pool has {format_bytes(self._allocated)} "
            f"allocated and {format_bytes(self._reserved)} reserved; the device has {format_bytes(free)} free "
            f"of {format_bytes(total)}, even after the cache was emptied"
        )

    def _split(self, block: _Block, size: int) -> _Block:
        if should_split(block.size, size, self.config):
            rest = _Block(block.ptr + size, block.size - size, block.segment, prev=block, next=block.next)
            if block.next is not None:
                block.next.prev = rest
            block.next, block.size = rest, size
            self._blocks[rest.ptr] = rest
            self._insert_free(rest)
        return block

    # -- freeing ---------------------------------------------------------------------

    def _live_block(self, ptr: int, what: str) -> _Block:
        block = self._blocks.get(ptr)
        if block is None or not block.allocated:
            raise ValueError(f"{what} {ptr:#x}: not an address this pool handed out, or already freed")
        return block

    def _free_locked(self, ptr: int) -> None:
        block = self._live_block(ptr, "free of")
        block.allocated = False
        self._allocated -= block.size
        self._requested -= block.requested
        self._counts["frees"] += 1
        if block.stream_uses:
            assert self.events is not None  # record_stream refused to add uses without it
            events = [self.events.record(s) for s in block.stream_uses]
            block.stream_uses = set()
            self._pending.append((block, events))
        else:
            self._return_to_free_list(block)

    def _process_events(self) -> None:
        if not self._pending:
            return
        waiting = []
        for block, events in self._pending:
            events = [e for e in events if not e.query()]
            if events:
                waiting.append((block, events))
            else:
                self._return_to_free_list(block)
        self._pending = waiting

    def _drain_later(self) -> None:
        while self._later:
            self._free_locked(self._later.popleft())

    def _return_to_free_list(self, block: _Block) -> None:
        if self.config.coalesce:
            for neighbour in (block.prev, block.next):
                if neighbour is not None and self._is_cached(neighbour):
                    self._remove_free(neighbour)
                    block = (
                        self._merge(neighbour, block)
                        if neighbour is block.prev
                        else self._merge(block, neighbour)
                    )
        self._insert_free(block)

    def _is_cached(self, block: _Block) -> bool:
        free = self._free.get((block.segment.small, block.segment.stream), [])
        i = bisect.bisect_left(free, (block.size, block.ptr))
        return i < len(free) and free[i] == (block.size, block.ptr)

    def _merge(self, left: _Block, right: _Block) -> _Block:
        """``left`` absorbs its successor ``right``; returns ``left``."""
        left.size += right.size
        left.next = right.next
        if right.next is not None:
            right.next.prev = left
        del self._blocks[right.ptr]
        return left

    def _insert_free(self, block: _Block) -> None:
        key = (block.segment.small, block.segment.stream)
        bisect.insort(self._free.setdefault(key, []), (block.size, block.ptr))

    def _remove_free(self, block: _Block) -> None:
        free = self._free[(block.segment.small, block.segment.stream)]
        free.pop(bisect.bisect_left(free, (block.size, block.ptr)))

    def _release_cached(self) -> None:
        for _, events in self._pending:
            for e in events:
                e.synchronize()
        self._process_events()
        for seg in list(self._segments.values()):
            blocks, b = [], self._blocks[seg.ptr]
            while b is not None and self._is_cached(b):
                blocks.append(b)
                b = b.next
            if b is not None:
                continue  # a block in use (or pending) keeps its segment
            for b in blocks:  # one block when coalescing; several when PoolConfig(coalesce=False)
                self._remove_free(b)
                del self._blocks[b.ptr]
            del self._segments[seg.ptr]
            self.device.free(seg.ptr)
            self._reserved -= seg.size
            self._counts["device_frees"] += 1


__all__ = [
    "DEFAULT_STREAM",
    "BlockInfo",
    "CachingAllocator",
    "DeviceAllocator",
    "DeviceMallocError",
    "Event",
    "EventSource",
    "OutOfMemoryError",
    "PYTORCH_CONFIG",
    "PoolConfig",
    "PoolStats",
    "SegmentInfo",
    "format_bytes",
    "is_small",
    "round_size",
    "segment_size",
    "should_split",
]
