"""Exercise 9.9 — a GPU memory pool, on a pretend device (no GPU needed).

The expected addresses and sizes follow from the rules in ``MemoryPool``'s docstring
(PyTorch's ``CUDACachingAllocator``): 512-byte rounding, 2 MiB small segments, 20 MiB large
segments below 10 MiB, best fit by (size, address). The last test replays a random workload
on the reference allocator (``llmrs_core.labs.memory_pool``) and on yours, and also
checks what needs no reference: no two live blocks overlap, and bytes written into a live
block survive.
"""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest

from llmrs_core.labs.fake_device import BASE, FakeDevice
from llmrs_core.labs.memory_pool import CachingAllocator

KiB, MiB = 1024, 1024 * 1024
STAT_KEYS = {
    "allocated_bytes",
    "peak_allocated_bytes",
    "reserved_bytes",
    "peak_reserved_bytes",
    "num_allocs",
    "num_frees",
    "num_cache_hits",
    "num_segments",
}


@pytest.fixture
def device():
    return FakeDevice(64 * MiB)


def free_blocks(segment) -> list[int]:
    return [size for _, size, allocated in segment if not allocated]


def show(segment) -> str:
    return ", ".join(f"{size} {'used' if allocated else 'free'}" for _, size, allocated in segment)


def test_ex9_9_round_size(ex):
    for n, want in [(1, 512), (512, 512), (513, 1024), (1000, 1024), (0, 512), (MiB + 1, MiB + 512)]:
        got = ex.round_size(n)
        assert got == want, (
            f"round_size({n}) returned {got}: sizes round up to the next multiple of 512 ({want})"
        )
    for bad in (-1, 2.5):
        try:
            got = ex.round_size(bad)
        except ValueError:
            continue
        pytest.fail(f"round_size({bad!r}) returned {got!r}: a size that is negative or not an int raises ValueError")


def test_ex9_9_forgot_to_round(ex, device):
    pool = ex.MemoryPool(device)
    a = pool.malloc(1000)
    b = pool.malloc(1)
    assert b - a == 1024, (
        f"the second block starts {b - a} bytes after the first: a request for 1000 bytes takes "
        "round_size(1000) = 1024 bytes, so the next block starts 1024 bytes on"
    )
    assert pool.stats()["allocated_bytes"] == 1024 + 512, (
        "allocated_bytes counts rounded sizes: 1024 for 1000 bytes, 512 for 1 byte"
    )


def test_ex9_9_one_segment_serves_many_small_requests(ex, device):
    pool = ex.MemoryPool(device)
    ptrs = [pool.malloc(512) for _ in range(4)]
    assert list(device.live.values()) == [2 * MiB], (
        f"four 512-byte requests made {len(device.live)} device allocations of sizes "
        f"{sorted(device.live.values())}: small requests are carved from one 2 MiB segment (segment_size)"
    )
    assert ptrs == [ptrs[0] + 512 * i for i in range(4)], "each block is split off the front of the free rest"
    (segment,) = pool.segments()
    assert segment == [*((p, 512, True) for p in ptrs), (ptrs[0] + 2048, 2 * MiB - 2048, False)], (
        f"the segment should be four used blocks of 512 and one free block of the rest; it is: {show(segment)}"
    )


def test_ex9_9_small_and_large_pools_are_separate(ex, device):
    pool = ex.MemoryPool(device)
    pool.malloc(512)
    big = pool.malloc(MiB + 512)
    assert sorted(device.live.values()) == [2 * MiB, 20 * MiB], (
        f"device allocations {sorted(device.live.values())}: a large request (over 1 MiB) never comes from a "
        "small segment, even one with room; below 10 MiB it gets a 20 MiB segment"
    )
    assert big in device.live, "the large block starts its own segment"
    other = FakeDevice(64 * MiB)
    ex.MemoryPool(other).malloc(11 * MiB - 5)
    assert list(other.live.values()) == [12 * MiB], (
        f"malloc(11 MiB - 5) on a fresh pool made device allocations of {list(other.live.values())} bytes: from "
        "10 MiB on a request gets a segment of its own size, rounded up to 2 MiB (12 MiB)"
    )


def test_ex9_9_a_freed_block_is_reused(ex, device):
    pool = ex.MemoryPool(device)
    a = pool.malloc(4096)
    pool.free(a)
    b = pool.malloc(4000)
    assert b == a, "after free, the same-sized request should get the cached block back"
    assert device.num_mallocs == 1, "the cache served the second request: no new device malloc"
    assert pool.stats()["num_cache_hits"] == 1, "a malloc served from a cached free block is a cache hit"


def test_ex9_9_first_fit_instead_of_best_fit(ex, device):
    pool = ex.MemoryPool(device)
    big = pool.malloc(4096)
    pool.malloc(512)  # guards keep the holes apart
    exact = pool.malloc(1024)
    pool.malloc(512)
    pool.free(big)
    pool.free(exact)
    got = pool.malloc(1000)
    assert got != big, (
        "malloc(1000) took the first free block that fits (4096 bytes at the segment's start); best fit "
        "takes the smallest that fits: the 1024-byte one"
    )
    assert got == exact, "best fit: the free block of 1024 bytes serves a request rounded to 1024"


def test_ex9_9_no_coalescing(ex, device):
    pool = ex.MemoryPool(device)
    a, b, c = pool.malloc(512), pool.malloc(1024), pool.malloc(512)
    guards = [pool.malloc(MiB), pool.malloc(MiB - 2048)]  # fill the segment: [512][1024][512][guards]
    pool.free(a)
    pool.free(c)
    pool.free(b)
    (segment,) = pool.segments()
    free = free_blocks(segment)
    assert free == [2048], (
        f"after freeing the middle block its neighbours were not merged: the segment has {len(free)} free "
        f"blocks of {', '.join(map(str, free))} bytes where one of 2048 was expected"
    )
    assert pool.malloc(2048) == a, "the merged 2048-byte block serves a 2048-byte request"
    pool.free(guards[1])
    pool.free(guards[0])
    assert free_blocks(pool.segments()[0]) == [2 * MiB - 2048], (
        "two neighbouring freed blocks at the end of the segment should have merged into one"
    )


def test_ex9_9_stats_not_decremented_on_free(ex, device):
    pool = ex.MemoryPool(device)
    a = pool.malloc(1000)
    b = pool.malloc(3 * MiB)
    pool.free(a)
    stats = pool.stats()
    assert set(stats) == STAT_KEYS, f"stats() keys should be exactly {sorted(STAT_KEYS)}, not {sorted(stats)}"
    assert stats["allocated_bytes"] == 3 * MiB, (
        f"allocated_bytes is {stats['allocated_bytes']} after freeing the 1024-byte block: free must subtract "
        "the block's size (3 MiB remain allocated)"
    )
    assert stats["peak_allocated_bytes"] == 1024 + 3 * MiB, "the peak stays at its highest value"
    assert stats["reserved_bytes"] == stats["peak_reserved_bytes"] == 22 * MiB, (
        "reserved_bytes: a 2 MiB and a 20 MiB segment, still held after the free"
    )
    assert (stats["num_allocs"], stats["num_frees"], stats["num_segments"], stats["num_cache_hits"]) == (
        2,
        1,
        2,
        0,
    )
    pool.free(b)
    assert pool.stats()["allocated_bytes"] == 0


def test_ex9_9_freeing_a_wrong_address(ex, device):
    pool = ex.MemoryPool(device)
    p = pool.malloc(512)
    pool.free(p)
    for ptr, what in ((p, "a block freed twice (its address was already returned)"),
                      (p + 4096, "an address malloc never returned (inside the segment's free rest)")):
        try:
            pool.free(ptr)
        except ValueError:
            continue
        pytest.fail(f"free of {what} went through: it must raise ValueError, or the block would sit in the free list "
                    "twice and be handed out to two callers. Keep the live blocks by address, and refuse others")


def test_ex9_9_matches_the_engine_on_a_random_workload(ex):
    rng = random.Random(9)
    mine_device, engine_device = FakeDevice(512 * MiB), FakeDevice(512 * MiB, keep_bytes=False)
    mine, engine = ex.MemoryPool(mine_device), CachingAllocator(engine_device)
    live: dict[int, tuple[int, int]] = {}  # ptr -> (bytes, fill)
    for step in range(400):
        if live and rng.random() < 0.5:
            ptr = rng.choice(sorted(live))
            mine.free(ptr)
            engine.free(ptr)
            del live[ptr]
            continue
        n = rng.choice([rng.randrange(1, 4 * KiB), rng.randrange(1, MiB), rng.randrange(MiB, 6 * MiB)])
        got, want = mine.malloc(n), engine.malloc(n)
        assert got - BASE == want - BASE, (
            f"step {step}: malloc({n}) returned offset {got - BASE:#x}, the engine's pool {want - BASE:#x}"
        )
        for other, (m, _) in live.items():
            assert got + n <= other or other + m <= got, f"step {step}: the new block overlaps a live one"
        fill = step % 200 + 1
        mine_device.write(got, np.full(n, fill, dtype=np.uint8))
        live[got] = (n, fill)
        for ptr, (m, f) in live.items():  # the ends of every live block, each step; all of it at the end
            ends = np.concatenate(
                [mine_device.read(ptr, min(m, 256)), mine_device.read(ptr + m - min(m, 256), min(m, 256))]
            )
            assert (ends == f).all(), f"step {step}: the bytes of a live block were overwritten"
    for ptr, (m, f) in live.items():
        assert (mine_device.read(ptr, m) == f).all(), "the bytes of a live block were overwritten"
    want_segments = [[(b.ptr, b.size, b.state == "allocated") for b in seg.blocks] for seg in engine.snapshot()]
    got_segments = [[tuple(b) for b in seg] for seg in mine.segments()]
    if got_segments != want_segments:
        if len(got_segments) != len(want_segments):
            pytest.fail(f"after 400 random steps segments() lists {len(got_segments)} segments; the engine's pool "
                        f"holds {len(want_segments)}")
        i = next(i for i, (g, w) in enumerate(zip(got_segments, want_segments)) if g != w)
        pytest.fail(f"after 400 random steps segment {i} of segments() is [{show(got_segments[i])}]; the engine's "
                    f"pool has [{show(want_segments[i])}] (segments by address, their blocks in address order)")
    want_stats, got_stats = dataclasses.asdict(engine.stats()), mine.stats()
    for key in sorted(STAT_KEYS):
        assert got_stats[key] == want_stats[key], (
            f"after 400 random steps {key} is {got_stats[key]}, the engine's pool says {want_stats[key]}"
        )
