"""A pretend GPU for the memory pool: an address space, its bytes, and streams' events (chapter 9, §9.4).

The caching allocator (:mod:`llmrs_core.labs.memory_pool`) only needs a
:class:`~llmrs_core.labs.memory_pool.DeviceAllocator` and an
:class:`~llmrs_core.labs.memory_pool.EventSource`; these fakes stand in for
``cudaMalloc`` and ``cudaEventRecord`` so the pool is tested, and its behaviour plotted,
on a machine with no GPU:

- :class:`FakeDevice` hands out addresses from a range starting at :data:`BASE` with a
  capacity limit (first fit, like a driver that never moves memory), keeps the bytes in a
  NumPy array standing for device memory, and writes :data:`POISON` over every range it
  takes back, so reading memory the pool gave away shows up as poison, not as old data;
- :class:`FakeEvents` records :class:`FakeEvent` objects that complete only when the test
  says the stream's work has run (:meth:`FakeEvents.complete`).
"""

from __future__ import annotations

import bisect
from collections.abc import Hashable

import numpy as np

from llmrs_core.labs.memory_pool import DeviceMallocError

BASE = 0x7F00_0000_0000  # where the fake address space starts (never 0, so a null pointer is an error)
POISON = 0xDD  # written over freed ranges
ALIGNMENT = 512


class FakeDevice:
    """``capacity`` bytes of pretend device memory (a :class:`DeviceAllocator`).

    ``keep_bytes=False`` drops the byte array (for plots of big workloads where only
    addresses matter); :meth:`write`, :meth:`read` and poisoning then do nothing.
    """

    def __init__(self, capacity: int, keep_bytes: bool = True) -> None:
        if capacity <= 0 or capacity % ALIGNMENT:
            raise ValueError(f"capacity must be a positive multiple of {ALIGNMENT} bytes, not {capacity}")
        self.capacity = capacity
        self.memory = np.zeros(capacity, dtype=np.uint8) if keep_bytes else None
        self.live: dict[int, int] = {}  # ptr -> size of every range handed out
        self._holes: list[tuple[int, int]] = [(0, capacity)]  # (offset, size), by offset
        self.num_mallocs = self.num_frees = 0

    # -- the DeviceAllocator protocol --------------------------------------------------

    def malloc(self, nbytes: int) -> int:
        size = -(-nbytes // ALIGNMENT) * ALIGNMENT
        if nbytes <= 0:
            raise ValueError(f"cudaMalloc of {nbytes} bytes")
        for i, (off, hole) in enumerate(self._holes):
            if hole >= size:
                if hole == size:
                    del self._holes[i]
                else:
                    self._holes[i] = (off + size, hole - size)
                self.live[BASE + off] = size
                self.num_mallocs += 1
                return BASE + off
        raise DeviceMallocError(
            f"fake device: no free range of {nbytes} bytes ({self.free_bytes} of {self.capacity} free)"
        )

    def free(self, ptr: int) -> None:
        size = self.live.pop(ptr, None)
        if size is None:
            raise ValueError(f"fake device: free of {ptr:#x}, which malloc did not return or was freed")
        self.poison(ptr, size)
        off = ptr - BASE
        i = bisect.bisect_left(self._holes, (off, 0))
        self._holes.insert(i, (off, size))
        for j in (i, i - 1):  # merge with the following, then the preceding hole
            if 0 <= j < len(self._holes) - 1:
                (a, n), (b, m) = self._holes[j], self._holes[j + 1]
                if a + n == b:
                    self._holes[j : j + 2] = [(a, n + m)]
        self.num_frees += 1

    def mem_info(self) -> tuple[int, int]:
        return self.free_bytes, self.capacity

    # -- what tests look at ------------------------------------------------------------

    @property
    def used_bytes(self) -> int:
        return sum(self.live.values())

    @property
    def free_bytes(self) -> int:
        return self.capacity - self.used_bytes

    def largest_free_range(self) -> int:
        """The biggest single malloc that would succeed now."""
        return max((n for _, n in self._holes), default=0)

    def _range(self, ptr: int, n: int) -> slice:
        off = ptr - BASE
        if not (0 <= off and off + n <= self.capacity):
            raise IndexError(f"fake device: [{ptr:#x}, +{n}) is outside the address space")
        return slice(off, off + n)

    def write(self, ptr: int, data: np.ndarray | bytes) -> None:
        """Store bytes at ``ptr`` (a kernel writing its output)."""
        if self.memory is not None:
            raw = (
                np.frombuffer(bytes(data), dtype=np.uint8) if isinstance(data, bytes) else data.view(np.uint8)
            )
            self.memory[self._range(ptr, raw.size)] = raw.ravel()

    def read(self, ptr: int, n: int) -> np.ndarray:
        """A copy of ``n`` bytes at ``ptr``."""
        if self.memory is None:
            raise ValueError("this FakeDevice was made with keep_bytes=False")
        return self.memory[self._range(ptr, n)].copy()

    def poison(self, ptr: int, n: int) -> None:
        """Overwrite ``n`` bytes at ``ptr`` with :data:`POISON`."""
        if self.memory is not None:
            self.memory[self._range(ptr, n)] = POISON


class FakeEvent:
    """An event that completes when its test says so (or when something waits on it)."""

    def __init__(self, stream: Hashable) -> None:
        self.stream, self.done = stream, False

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.done = True  # waiting lets the stream's queued work finish


class FakeEvents:
    """An :class:`EventSource` whose events the test completes, stream by stream."""

    def __init__(self) -> None:
        self.recorded: list[FakeEvent] = []

    def record(self, stream: Hashable) -> FakeEvent:
        event = FakeEvent(stream)
        self.recorded.append(event)
        return event

    def complete(self, stream: Hashable) -> None:
        """Everything queued on ``stream`` so far has run."""
        for event in self.recorded:
            if event.stream == stream:
                event.done = True

    def complete_all(self) -> None:
        for event in self.recorded:
            event.done = True


__all__ = ["ALIGNMENT", "BASE", "POISON", "FakeDevice", "FakeEvent", "FakeEvents"]
