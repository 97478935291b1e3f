"""Chapter 9's tests name each known mistake: proven by planting it.

As for chapter 10 (test_diagnose_ch10.py): each mistake is planted in a copy of the
solution — the engine's allocator behind 9.9 with one method recompiled from its source
with one edit (:func:`llmrs_core.testing.plant`), or, for the kernels of 9.7 and 9.8, a
learner's kernel written here with a switch for each mistake — and the chapter 9 test named
after the mistake must fail with its own message.

The kernels run where chapter 9's do: on an NVIDIA GPU when the driver has one, else in
numba-cuda's CUDA simulator, chosen here before anything imports ``numba.cuda`` (as
tests/ch09/conftest.py does; run this file in a process of its own, or after tests/ch09).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from llmrs_core.kernels.gpu import runtime

try:
    SIMULATOR = runtime.use_simulator_unless_gpu()
    cuda = runtime.cuda()
except runtime.CudaUnavailableError as e:  # numba.cuda imported earlier in this process, for no GPU
    pytest.skip(f"chapter 9's kernels cannot run in this process: {e}", allow_module_level=True)

from llmrs_core.labs.fake_device import FakeDevice  # noqa: E402
from llmrs_core.labs.memory_pool import CachingAllocator  # noqa: E402
from llmrs_core.testing import chapter_tests, plant, solution_with, with_methods  # noqa: E402
from llmrs_core.testing import failure_message as failure  # noqa: E402

T97 = chapter_tests(9, "test_ex9_7_rms_norm_kernel.py")
T98 = chapter_tests(9, "test_ex9_8_q4_1_matvec.py")
T99 = chapter_tests(9, "test_ex9_9_memory_pool.py")
SOLUTION = solution_with(9)

THREADS = 32  # the learner's block size (the simulator runs each thread as a Python thread)


# -- 9.7: RMSNorm, a block per row ------------------------------------------------------------

NO_STRIDE, ONE_BLOCK, ONE_PARTIAL, NO_MEAN, EPS_OUTSIDE, NO_WEIGHT = range(1, 7)


@cuda.jit
def rms_norm_kernel(x, weight, eps, out, mistake):
    row = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    d = x.shape[1]
    partial = cuda.shared.array(THREADS, np.float32)
    inv = cuda.shared.array(1, np.float32)
    acc = np.float32(0.0)
    k = tid
    while k < d:
        acc += x[row, k] * x[row, k]
        k += cuda.blockDim.x if mistake != NO_STRIDE else d
    partial[tid] = acc
    cuda.syncthreads()
    if tid == 0:
        total = np.float32(0.0)
        for i in range(1 if mistake == ONE_PARTIAL else cuda.blockDim.x):
            total += partial[i]
        mean = total if mistake == NO_MEAN else total / d
        inv[0] = 1.0 / (math.sqrt(mean) + eps) if mistake == EPS_OUTSIDE else 1.0 / math.sqrt(mean + eps)
    cuda.syncthreads()
    k = tid
    while k < d:
        out[row, k] = x[row, k] * inv[0] * (weight[k] if mistake != NO_WEIGHT else np.float32(1.0))
        k += cuda.blockDim.x if mistake != NO_STRIDE else d


def rms_norm(mistake: int = 0):
    def launch_rms_norm(x, weight, eps, out):
        blocks = 1 if mistake == ONE_BLOCK else x.shape[0]
        rms_norm_kernel[blocks, THREADS](x, weight, np.float32(eps), out, mistake)

    return {"launch_rms_norm": launch_rms_norm}


RMS_MISTAKES = {
    "no stride loop": (NO_STRIDE, T97.test_ex9_7_one_row, "were never written — the threads' loop"),
    "one block for all rows": (ONE_BLOCK, T97.test_ex9_7_several_rows_of_an_odd_width,
                               "row 1: your kernel left the output untouched — did every row get a block"),
    "only one thread's partial sum": (ONE_PARTIAL, T97.test_ex9_7_one_row, "is the sum of squares complete?"),
    "the sum, not the mean": (NO_MEAN, T97.test_ex9_7_one_row, "the sum of squares was not divided by d"),
    "eps outside the square root": (EPS_OUTSIDE, T97.test_ex9_7_eps_matters_for_a_zero_row,
                                    "row 1: eps was added after the square root"),
    "no weight": (NO_WEIGHT, T97.test_ex9_7_several_rows_of_an_odd_width, "off by the weight"),
}


@pytest.mark.parametrize("mistake", RMS_MISTAKES)
def test_each_rms_norm_kernel_mistake_gets_its_own_message(mistake):
    flag, test, message = RMS_MISTAKES[mistake]
    text = failure(test, solution_with(9, **rms_norm(flag)))
    assert message in text, text


def test_the_learner_style_rms_norm_kernel_passes():
    """The kernel the mistakes are switched on in is right without them."""
    ex = solution_with(9, **rms_norm())
    T97.test_ex9_7_several_rows_of_an_odd_width(ex)
    T97.test_ex9_7_eps_matters_for_a_zero_row(ex)


# -- 9.8: Q4_1 dequantise-and-matvec, a thread per (row, token) --------------------------------

SWAPPED, INTERLEAVED, NO_MIN, BLOCK_0, ROWS_ROUNDED_DOWN, ONE_TOKEN = range(1, 7)
ROW_THREADS = 4


@cuda.jit
def q4_1_kernel(qs, d, m, x, out, mistake):
    r = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    t = cuda.blockIdx.y
    if r >= out.shape[1]:
        return
    acc = np.float32(0.0)
    for b in range(d.shape[1]):
        dot = np.float32(0.0)
        sx = np.float32(0.0)
        for j in range(16):
            byte = np.int32(qs[r, 16 * b + j])
            lo, hi = (byte >> 4, byte & 15) if mistake == SWAPPED else (byte & 15, byte >> 4)
            if mistake == INTERLEAVED:
                x0, x1 = x[t, 32 * b + 2 * j], x[t, 32 * b + 2 * j + 1]
            else:
                x0, x1 = x[t, 32 * b + j], x[t, 32 * b + j + 16]
            dot += lo * x0 + hi * x1
            sx += x0 + x1
        block = 0 if mistake == BLOCK_0 else b
        acc += d[r, block] * dot + (np.float32(0.0) if mistake == NO_MIN else m[r, block] * sx)
    out[t, r] = acc


def q4_1_matvec(mistake: int = 0):
    def launch_q4_1_matvec(qs, d, m, x, out):
        tokens, rows = out.shape
        grid_rows = rows // ROW_THREADS if mistake == ROWS_ROUNDED_DOWN else -(-rows // ROW_THREADS)
        q4_1_kernel[(grid_rows, 1 if mistake == ONE_TOKEN else tokens), ROW_THREADS](qs, d, m, x, out, mistake)

    return {"launch_q4_1_matvec": launch_q4_1_matvec}


Q4_1_MISTAKES = {
    "nibbles swapped": (SWAPPED, T98.test_ex9_8_one_token, "the nibble order looks swapped"),
    "nibbles as neighbours": (INTERLEAVED, T98.test_ex9_8_one_token, "not 2j and 2j + 1"),
    "no minimum": (NO_MIN, T98.test_ex9_8_one_token, "the minimum is missing"),
    "block 0's scale for every block": (BLOCK_0, T98.test_ex9_8_more_rows_and_blocks, "used block 0's scale"),
    "the grid rounded down": (ROWS_ROUNDED_DOWN, T98.test_ex9_8_more_rows_and_blocks,
                              "row 12: your kernel left the output untouched"),
    "one token only": (ONE_TOKEN, T98.test_ex9_8_several_tokens, "token 1, row 0: your kernel left the output"),
}


@pytest.mark.parametrize("mistake", Q4_1_MISTAKES)
def test_each_q4_1_kernel_mistake_gets_its_own_message(mistake):
    flag, test, message = Q4_1_MISTAKES[mistake]
    text = failure(test, solution_with(9, **q4_1_matvec(flag)))
    assert message in text, text


def test_the_learner_style_q4_1_kernel_passes():
    ex = solution_with(9, **q4_1_matvec())
    T98.test_ex9_8_more_rows_and_blocks(ex)
    T98.test_ex9_8_several_tokens(ex)


# -- 9.9: the memory pool ------------------------------------------------------------------------


def pool(**edits):
    """The solution's MemoryPool over a CachingAllocator with :func:`plant`'s edits in some methods."""
    allocator = with_methods(CachingAllocator, **edits)
    init = plant(SOLUTION.MemoryPool.__init__, CachingAllocator=allocator)
    return {"MemoryPool": type("MemoryPool", (SOLUTION.MemoryPool,), {"__init__": init})}


FIRST_FIT = ("""    i = bisect.bisect_left(free, (size, -1))
    if i == len(free):
        return None
    _, ptr = free.pop(i)""", """    fits = [e for e in free if e[0] >= size]
    if not fits:
        return None
    first = min(fits, key=lambda e: e[1])
    free.remove(first)
    ptr = first[1]""")  # (a method's source is dedented: its body is indented by 4)

POOL_MISTAKES = {
    "no rounding": (pool(malloc=[("size = round_size(nbytes, self.config)", "size = nbytes")]),
                    T99.test_ex9_9_forgot_to_round, "a request for 1000 bytes takes round_size(1000) = 1024"),
    "no split": (pool(_split=[("if should_split(block.size, size, self.config):", "if False:")]),
                 T99.test_ex9_9_one_segment_serves_many_small_requests, "small requests are carved from one 2 MiB"),
    "one pool for small and large": (
        pool(_find_free=[("free = self._free.get((is_small(size, self.config), stream))",
                          "free = sorted(self._free.get((True, stream), []) + self._free.get((False, stream), []))")]),
        T99.test_ex9_9_small_and_large_pools_are_separate, "a large request (over 1 MiB) never comes from a small"),
    "first fit": (pool(_find_free=[FIRST_FIT]), T99.test_ex9_9_first_fit_instead_of_best_fit,
                  "took the first free block that fits"),
    "no coalescing": (pool(_return_to_free_list=[("if self.config.coalesce:", "if False:")]),
                      T99.test_ex9_9_no_coalescing, "its neighbours were not merged"),
    "a cache hit not counted": (pool(malloc=[('self._counts["cache_hits"] += 1', "pass")]),
                                T99.test_ex9_9_a_freed_block_is_reused, "is a cache hit"),
    "free does not subtract": (pool(_free_locked=[("self._allocated -= block.size", "pass")]),
                               T99.test_ex9_9_stats_not_decremented_on_free, "free must subtract the block's size"),
    "segments newest first": (
        {"MemoryPool": with_methods(SOLUTION.MemoryPool, segments=[("for s in self._pool.snapshot()",
                                                                    "for s in self._pool.snapshot()[::-1]")])},
        T99.test_ex9_9_matches_the_engine_on_a_random_workload, "segments by address, their blocks in address order"),
    "a double free accepted": (pool(_live_block=[("if block is None or not block.allocated:", "if block is None:")]),
                               T99.test_ex9_9_freeing_a_wrong_address, "free of a block freed twice (its address was already returned) went through"),
}


@pytest.mark.parametrize("mistake", POOL_MISTAKES)
def test_each_memory_pool_mistake_gets_its_own_message(mistake):
    planted, test, message = POOL_MISTAKES[mistake]
    args = () if test is T99.test_ex9_9_matches_the_engine_on_a_random_workload else (FakeDevice(64 * 1024 * 1024),)
    text = failure(test, solution_with(9, **planted), *args)
    assert message in text, text


ROUNDING_MISTAKES = {
    "one block too many": (lambda n, config=None: (n // 512 + 1) * 512, "round_size(512) returned 1024"),
    "0 bytes take nothing": (lambda n, config=None: -(-n // 512) * 512, "round_size(0) returned 0"),
    "bad sizes accepted": (lambda n, config=None: max(512, -(-int(abs(n)) // 512) * 512),
                           "a size that is negative or not an int raises ValueError"),
}


@pytest.mark.parametrize("mistake", ROUNDING_MISTAKES)
def test_each_round_size_mistake_gets_its_own_message(mistake):
    wrong, message = ROUNDING_MISTAKES[mistake]
    text = failure(T99.test_ex9_9_round_size, solution_with(9, round_size=wrong))
    assert message in text, text
