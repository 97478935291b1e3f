"""The caching GPU allocator (llmrs_core.labs.memory_pool) on a fake device, CPU only.

Expected values follow from PyTorch's ``CUDACachingAllocator`` rules as the module docstring
states them (512-byte rounding, 2 MiB small segments, 20 MiB large segments below 10 MiB,
2 MiB rounding above, best fit by (size, address), should_split). The stateful test checks
the pool against an independent model: the fake device's own record of what it handed out,
the bytes stored in it, and a dict of the live allocations. No numba.cuda here.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from llmrs_core.labs.fake_device import BASE, POISON, FakeDevice, FakeEvents
from llmrs_core.labs.memory_pool import (
    PYTORCH_CONFIG,
    CachingAllocator,
    OutOfMemoryError,
    PoolConfig,
    round_size,
    segment_size,
)
from llmrs_core.labs.memory_workload import DecodeWorkload, decode_trace, replay

KiB, MiB = 1024, 1024 * 1024


def make_pool(capacity: int = 64 * MiB, config: PoolConfig = PYTORCH_CONFIG, keep_bytes: bool = True):
    device, events = FakeDevice(capacity, keep_bytes=keep_bytes), FakeEvents()
    return CachingAllocator(device, events, config), device, events


def layout(pool: CachingAllocator, seg: int = 0) -> list[tuple[int, str]]:
    return [(b.size, b.state) for b in pool.snapshot()[seg].blocks]


# -- rounding and pools ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("n", "want"), [(0, 512), (1, 512), (512, 512), (513, 1024), (1000, 1024), (MiB + 1, MiB + 512)]
)
def test_sizes_round_up_to_512(n, want):
    assert round_size(n) == want
    pool, _, _ = make_pool()
    assert pool.block_size(pool.malloc(n)) == want
    assert pool.stats().requested_bytes == n and pool.stats().allocated_bytes == want


@pytest.mark.parametrize("bad", [-1, 1.5, "8", True, None])
def test_bad_sizes_are_refused(bad):
    pool, _, _ = make_pool()
    with pytest.raises(ValueError, match="non-negative int"):
        pool.malloc(bad)


@pytest.mark.parametrize(
    ("n", "segment", "pool_name"),
    [(512, 2 * MiB, "small"), (MiB, 2 * MiB, "small"), (MiB + 1, 20 * MiB, "large"),
     (10 * MiB - 512, 20 * MiB, "large"), (10 * MiB, 10 * MiB, "large"), (11 * MiB - 5, 12 * MiB, "large")],
)  # fmt: skip
def test_segment_sizes_follow_pytorch(n, segment, pool_name):
    pool, device, _ = make_pool()
    pool.malloc(n)
    assert list(device.live.values()) == [segment] == [segment_size(round_size(n))]
    assert pool.snapshot()[0].pool == pool_name


def test_small_and_large_requests_never_share_a_segment():
    pool, device, _ = make_pool()
    pool.malloc(512)  # a small segment of 2 MiB, 2 MiB - 512 of it free
    pool.malloc(MiB + 512)  # large: would fit in that free space, but gets its own segment
    assert sorted(device.live.values()) == [2 * MiB, 20 * MiB]
    assert [s.pool for s in pool.snapshot()] == ["small", "large"]


# -- best fit, splitting, coalescing ------------------------------------------------------


def _holes(pool, sizes):
    """Live blocks of ``sizes`` in one segment with a 512-byte guard after each; frees them."""
    ptrs = []
    for size in sizes:
        ptrs.append(pool.malloc(size))
        pool.malloc(512)  # keeps the holes apart
    for p in ptrs:
        pool.free(p)
    return ptrs


def test_best_fit_takes_the_smallest_free_block_that_fits():
    pool, _, _ = make_pool()
    big, exact, mid = _holes(pool, [4096, 1024, 2048])
    assert pool.malloc(1000) == exact, "1000 -> 1024 bytes: the 1024-byte hole, not the first (4096) one"
    assert pool.malloc(1500) == mid
    assert pool.malloc(3000) == big


def test_best_fit_breaks_ties_by_lowest_address():
    pool, _, _ = make_pool()
    first, second = _holes(pool, [1024, 1024])
    assert pool.malloc(1024) == first and pool.malloc(1024) == second


def test_split_leaves_the_remainder_free():
    pool, _, _ = make_pool()
    p = pool.malloc(512)
    assert layout(pool) == [(512, "allocated"), (2 * MiB - 512, "free")]
    q = pool.malloc(1024)
    assert q == p + 512, "the next request is carved from the remainder, right after the first block"
    assert layout(pool) == [(512, "allocated"), (1024, "allocated"), (2 * MiB - 1536, "free")]


def test_large_blocks_split_only_when_more_than_1_mib_would_remain():
    pool, _, _ = make_pool()
    p = pool.malloc(2 * MiB)
    assert layout(pool) == [(2 * MiB, "allocated"), (18 * MiB, "free")]
    pool.free(p)
    q = pool.malloc(19 * MiB + 512)  # leaves 1 MiB - 512 bytes: not worth a block
    assert pool.block_size(q) == 20 * MiB and pool.stats().allocated_bytes == 20 * MiB
    assert layout(pool) == [(20 * MiB, "allocated")]


def test_freeing_the_middle_block_merges_both_neighbours():
    pool, _, _ = make_pool()
    a, b, c = pool.malloc(512), pool.malloc(1024), pool.malloc(512)
    pool.free(a)
    pool.free(c)  # c merges with the free remainder after it
    assert layout(pool) == [(512, "free"), (1024, "allocated"), (2 * MiB - 1536, "free")]
    pool.free(b)
    assert layout(pool) == [(2 * MiB, "free")]


def test_a_block_split_from_a_hole_leaves_a_remainder_that_still_merges():
    pool, _, _ = make_pool()
    hole, right = pool.malloc(4096), pool.malloc(512)
    pool.malloc(512)  # a guard after them
    pool.free(hole)
    b = pool.malloc(1024)  # split from the hole: [b 1024][rest 3072][right 512]...
    assert b == hole
    pool.free(right)  # merges with its left neighbour, which is now the remainder
    assert layout(pool)[:3] == [(1024, "allocated"), (3072 + 512, "free"), (512, "allocated")]
    pool.free(b)
    assert layout(pool)[:2] == [(4096 + 512, "free"), (512, "allocated")]


def test_without_coalescing_the_fragments_stay():
    pool, _, _ = make_pool(config=PoolConfig(coalesce=False))
    a, b = pool.malloc(512), pool.malloc(512)
    pool.free(a)
    pool.free(b)
    assert layout(pool) == [(512, "free"), (512, "free"), (2 * MiB - 1024, "free")]
    assert pool.malloc(1024) not in (a, b), "two 512-byte fragments cannot serve 1024 bytes"


# -- streams and events ----------------------------------------------------------------------


def test_a_block_freed_on_one_stream_is_reused_only_on_that_stream():
    pool, device, _ = make_pool()
    p = pool.malloc(4096, stream="A")
    pool.free(p)
    q = pool.malloc(4096, stream="B")
    assert device.num_mallocs == 2 and pool.snapshot()[1].stream == "B", "B gets a segment of its own"
    assert pool.malloc(4096, stream="A") == p and pool.stats().num_cache_hits == 1
    pool.free(q)
    assert pool.malloc(4096, stream="B") == q


def test_record_stream_holds_a_freed_block_until_the_other_streams_events_complete():
    pool, _, events = make_pool()
    p = pool.malloc(4096, stream="A")
    pool.record_stream(p, "B")
    pool.record_stream(p, "C")
    pool.record_stream(p, "A")  # its own stream: no event needed
    pool.free(p)
    assert pool.stats().allocated_bytes == 0, "the bytes stop counting as allocated at free"
    assert sorted(e.stream for e in events.recorded) == ["B", "C"]
    assert layout(pool)[0] == (4096, "pending")
    assert pool.malloc(4096, stream="A") != p, "B and C may still be reading it"
    events.complete("B")
    assert pool.malloc(4096, stream="A") != p, "C may still be reading it"
    events.complete("C")
    assert pool.malloc(4096, stream="A") == p


def test_record_stream_needs_an_event_source_and_a_live_block():
    pool = CachingAllocator(FakeDevice(64 * MiB))
    p = pool.malloc(512)
    with pytest.raises(ValueError, match="EventSource"):
        pool.record_stream(p, "B")
    pool.free(p)
    with pytest.raises(ValueError, match="already freed"):
        pool.record_stream(p, "B")


# -- out of memory, empty_cache -------------------------------------------------------------


def test_out_of_memory_releases_cached_segments_and_retries():
    pool, device, _ = make_pool(capacity=22 * MiB)
    pool.free(pool.malloc(512))  # a cached small segment of 2 MiB
    pool.free(pool.malloc(11 * MiB))  # a cached large segment of 12 MiB: 8 MiB left on the device
    p = pool.malloc(21 * MiB)  # needs 22 MiB: only after both cached segments go back
    s = pool.stats()
    assert (s.num_cache_flushes, s.num_device_frees, s.num_segments, s.num_ooms) == (1, 2, 1, 0)
    assert device.live == {p: 22 * MiB} and s.reserved_bytes == 22 * MiB


def test_out_of_memory_error_names_the_sizes():
    pool, device, _ = make_pool(capacity=22 * MiB)
    p = pool.malloc(21 * MiB)
    with pytest.raises(OutOfMemoryError) as err:
        pool.malloc(2 * MiB)
    message = str(err.value)
    for part in ("tried to allocate 2.00 MiB", "20.00 MiB", "22.00 MiB allocated", "22.00 MiB reserved",
                 "0 bytes free of 22.00 MiB"):  # fmt: skip
        assert part in message, (part, message)
    s = pool.stats()
    assert (s.num_ooms, s.num_cache_flushes, s.active_allocations) == (1, 1, 1)
    assert pool.block_size(p) == 22 * MiB, "the failed request left the live block alone"


def test_empty_cache_releases_only_wholly_free_segments():
    pool, device, events = make_pool()
    keep = pool.malloc(512)
    pool.free(pool.malloc(3 * MiB))
    pending = pool.malloc(MiB + 512, stream="A")
    pool.record_stream(pending, "B")
    pool.free(pending)
    assert pool.stats().reserved_bytes == 2 * MiB + 20 * MiB + 20 * MiB
    pool.empty_cache()  # waits for B's event, then releases both large segments
    assert device.live == {keep: 2 * MiB} and pool.stats().reserved_bytes == 2 * MiB
    assert all(e.done for e in events.recorded)
    pool.free(keep)
    pool.empty_cache()
    assert device.live == {} and pool.stats().num_segments == 0


def test_empty_cache_releases_uncoalesced_segments_too():
    pool, device, _ = make_pool(config=PoolConfig(coalesce=False))
    a, b = pool.malloc(512), pool.malloc(512)
    pool.free(a)
    pool.free(b)
    pool.empty_cache()
    assert device.live == {}


# -- stats, errors, finalisers, bytes ------------------------------------------------------


def test_stats_are_exact():
    pool, _, _ = make_pool()
    a = pool.malloc(1000)  # 1024 in a new 2 MiB segment
    b = pool.malloc(3 * MiB)  # 3 MiB in a new 20 MiB segment
    pool.free(a)
    c = pool.malloc(700)  # 1024 again: from the cache
    s = pool.stats()
    assert s.allocated_bytes == 1024 + 3 * MiB and s.peak_allocated_bytes == 1024 + 3 * MiB
    assert s.reserved_bytes == s.peak_reserved_bytes == 22 * MiB
    assert s.requested_bytes == 700 + 3 * MiB
    assert (s.num_allocs, s.num_frees, s.num_cache_hits, s.num_device_mallocs, s.active_allocations) == (
        3, 1, 1, 2, 2,
    ), "only the third malloc was served from a cached free block"  # fmt: skip
    pool.free(b)
    pool.free(c)
    pool.empty_cache()
    s = pool.stats()
    assert (s.allocated_bytes, s.requested_bytes, s.reserved_bytes, s.num_segments) == (0, 0, 0, 0)
    assert s.peak_allocated_bytes == 1024 + 3 * MiB and s.peak_reserved_bytes == 22 * MiB
    pool.reset_peak_stats()
    assert pool.stats().peak_reserved_bytes == 0


def test_freeing_twice_or_a_foreign_address_is_an_error():
    pool, _, _ = make_pool()
    p = pool.malloc(512)
    pool.free(p)
    with pytest.raises(ValueError, match=f"{p:#x}.*already freed"):
        pool.free(p)
    with pytest.raises(ValueError, match="not an address this pool handed out"):
        pool.free(p + 512)  # inside the segment, but not a block's start


def test_a_finaliser_may_free_in_the_middle_of_a_malloc():
    class GCDuringMalloc(FakeDevice):
        victim: int | None = None

        def malloc(self, nbytes):
            if self.victim is not None:  # the garbage collector runs a finaliser right here
                pool.free_later(self.victim)
                self.victim = None
            return super().malloc(nbytes)

    device = GCDuringMalloc(64 * MiB)
    pool = CachingAllocator(device)
    device.victim = pool.malloc(512)
    pool.malloc(2 * MiB)  # a device malloc, during which the small block is "collected"
    assert pool.stats().active_allocations == 1 and pool.stats().allocated_bytes == 2 * MiB
    pool.free_later(pool.malloc(4096))  # outside any call: freed at once
    assert pool.stats().num_frees == 2


def test_bytes_of_a_live_block_survive_other_traffic_and_freed_segments_are_poisoned():
    pool, device, _ = make_pool()
    p = pool.malloc(4096)
    data = np.arange(4096, dtype=np.uint32).astype(np.uint8)
    device.write(p, data)
    for n in (512, 100_000, 3 * MiB, 512):
        pool.free(pool.malloc(n))
    pool.empty_cache()
    np.testing.assert_array_equal(device.read(p, 4096), data)
    large = [s.ptr for s in pool.snapshot()]
    pool.free(p)
    pool.empty_cache()
    assert (device.read(large[0], 2 * MiB) == POISON).all()


# -- the stateful test against a dict model -------------------------------------------------

# A scaled-down geometry: the same rules with segments of a few KiB, so that a few dozen steps
# split, coalesce, run out of a 96 KiB device and empty the cache many times over.
SMALL = PoolConfig(small_max=2 * KiB, small_segment=4 * KiB, large_segment=16 * KiB,
                   min_large_alloc=8 * KiB, round_large=4 * KiB)  # fmt: skip
STREAMS = ("A", "B")


class PoolMachine(RuleBasedStateMachine):
    config = SMALL

    def __init__(self) -> None:
        super().__init__()
        self.device, self.events = FakeDevice(96 * KiB), FakeEvents()
        self.pool = CachingAllocator(self.device, self.events, self.config)
        self.live: dict[int, tuple[int, str, int]] = {}  # ptr -> (requested bytes, stream, fill byte)
        self.pending: list[tuple[int, int, set[str]]] = []  # (ptr, size, streams whose work may still use it)
        self.uses: dict[int, set[str]] = {}
        self.allocs = self.fills = 0
        self.peak_allocated = self.peak_reserved = 0

    def _allocated_blocks(self):
        return {b.ptr: b.size for s in self.pool.snapshot() for b in s.blocks if b.state == "allocated"}

    @rule(
        n=st.one_of(st.integers(0, 2 * KiB), st.integers(2 * KiB, 24 * KiB)), stream=st.sampled_from(STREAMS)
    )
    def malloc(self, n, stream):
        flushes = self.pool.stats().num_cache_flushes
        size = round_size(n, self.config)
        try:
            ptr = self.pool.malloc(n, stream)
        except OutOfMemoryError:
            self.pending.clear()  # the retry waited on every event
            small = size <= self.config.small_max
            assert self.device.largest_free_range() < segment_size(size, self.config), (
                "OOM while the device had room"
            )
            for seg in self.pool.snapshot():
                if seg.stream == stream and (seg.pool == "small") == small:
                    assert all(b.size < size for b in seg.blocks if b.state == "free"), "OOM with a free fit"
            return
        if self.pool.stats().num_cache_flushes > flushes:
            self.pending.clear()
        block = self.pool.block_size(ptr)
        assert block >= size
        for p, s, streams in self.pending:
            assert streams == set() or not (p < ptr + block and ptr < p + s), (
                "handed out a block that another stream may still use"
            )
        (seg,) = [s for s in self.pool.snapshot() if s.ptr <= ptr < s.ptr + s.size]
        assert seg.stream == stream, f"a block of stream {seg.stream} was handed out on {stream}"
        self.fills = self.fills % 200 + 1
        self.device.memory[ptr - BASE : ptr - BASE + n] = self.fills
        self.live[ptr] = (n, stream, self.fills)
        self.uses[ptr] = set()
        self.allocs += 1

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def free(self, data):
        ptr = data.draw(st.sampled_from(sorted(self.live)))
        n, stream, _ = self.live.pop(ptr)
        size = self.pool.block_size(ptr)
        if data.draw(st.booleans()):
            self.pool.free(ptr)
        else:
            self.pool.free_later(ptr)  # as a finaliser would: outside any call, it frees at once
        self.device.poison(ptr, n)  # the stale bytes must never reach another live allocation
        others = self.uses.pop(ptr)
        if others:
            self.pending.append((ptr, size, set(others)))

    @precondition(lambda self: self.live)
    @rule(data=st.data(), stream=st.sampled_from(STREAMS))
    def record_stream(self, data, stream):
        ptr = data.draw(st.sampled_from(sorted(self.live)))
        self.pool.record_stream(ptr, stream)
        if stream != self.live[ptr][1]:
            self.uses[ptr].add(stream)

    @rule(stream=st.sampled_from(STREAMS))
    def complete(self, stream):
        self.events.complete(stream)
        for _, _, streams in self.pending:
            streams.discard(stream)

    @rule()
    def empty_cache(self):
        self.pool.empty_cache()
        self.pending.clear()
        assert all(any(b.state != "free" for b in s.blocks) for s in self.pool.snapshot()), (
            "empty_cache kept a wholly free segment"
        )

    @invariant()
    def segments_are_tiled_and_match_the_device(self):
        segments = self.pool.snapshot()
        assert {s.ptr: s.size for s in segments} == self.device.live
        for seg in segments:
            at = seg.ptr
            for b in seg.blocks:
                assert b.ptr == at, f"segment {seg.ptr:#x}: a gap or overlap at {at:#x}"
                at += b.size
            assert at == seg.ptr + seg.size, f"segment {seg.ptr:#x}: blocks do not add up to its size"
            for left, right in zip(seg.blocks, seg.blocks[1:]):
                assert not self.config.coalesce or not (left.state == right.state == "free"), (
                    "two adjacent free blocks were not merged"
                )

    @invariant()
    def live_allocations_are_the_models_and_keep_their_bytes(self):
        blocks = self._allocated_blocks()
        assert set(blocks) == set(self.live)
        for ptr, (n, _, fill) in self.live.items():
            assert round_size(n, self.config) <= blocks[ptr]
            stored = self.device.memory[ptr - BASE : ptr - BASE + n]
            assert (stored == fill).all(), f"the bytes of the allocation at {ptr:#x} were overwritten"

    @invariant()
    def stats_equal_the_model(self):
        s, blocks = self.pool.stats(), self._allocated_blocks()
        self.peak_allocated = max(self.peak_allocated, sum(blocks.values()))
        self.peak_reserved = max(self.peak_reserved, self.device.used_bytes)
        assert s.allocated_bytes == sum(blocks.values())
        assert s.requested_bytes == sum(n for n, _, _ in self.live.values())
        assert s.reserved_bytes == self.device.used_bytes and s.num_segments == len(self.device.live)
        assert (s.num_allocs, s.active_allocations) == (self.allocs, len(self.live))
        assert (s.peak_allocated_bytes, s.peak_reserved_bytes) == (self.peak_allocated, self.peak_reserved)
        assert s.num_device_mallocs == self.device.num_mallocs and s.num_device_frees == self.device.num_frees


class UncoalescedPoolMachine(PoolMachine):
    config = dataclasses.replace(SMALL, coalesce=False)


MACHINE_SETTINGS = settings(
    deadline=None, suppress_health_check=[HealthCheck.too_slow], stateful_step_count=40
)
TestPoolMachine = PoolMachine.TestCase
TestPoolMachine.settings = settings(MACHINE_SETTINGS, max_examples=60)
TestUncoalescedPoolMachine = UncoalescedPoolMachine.TestCase
TestUncoalescedPoolMachine.settings = settings(MACHINE_SETTINGS, max_examples=25)


# -- the synthetic decode workload of §9.4 ---------------------------------------------------


def test_decode_trace_is_well_formed_and_replays():
    w = DecodeWorkload(steps=60, slots=3, min_tokens=5, max_tokens=40, chunk_tokens=8)
    events = decode_trace(w)
    assert events == decode_trace(w), "deterministic for a seed"
    live: dict[int, int] = {}
    for kind, handle, nbytes in events:
        if kind == "malloc":
            assert handle not in live and nbytes > 0
            live[handle] = nbytes
        elif kind == "free":
            del live[handle]
    caches = sorted(live.values())
    assert len(caches) == 3, "at the end only the three sequences' KV caches are live"
    assert all(n % (8 * w.kv_bytes_per_token) == 0 for n in caches), "caches grow by whole chunks"
    assert sum(kind == "step" for kind, _, _ in events) == 60
    pool, device, _ = make_pool(capacity=1 << 30, keep_bytes=False)
    steps = []
    still_live = replay(pool, events, steps.append)
    assert steps == list(range(60)) and len(still_live) == 3
    assert pool.stats().allocated_bytes == sum(pool.block_size(p) for p in still_live.values())
    with pytest.raises(ValueError, match="a workload needs"):
        decode_trace(DecodeWorkload(min_tokens=10, max_tokens=5))
