"""Chapter 9 — GPU Acceleration with CUDA and ROCm: your exercises.

Exercise 9.7  Writing a CUDA Kernel                     (ch09_gpu.ipynb, section 9.7)
Exercise 9.8  A Dequantize-and-Matvec Kernel            (ch09_gpu.ipynb, section 9.8)
Exercise 9.9  GPU Memory Pool                           (ch09_gpu.ipynb, section 9.9)

Your kernels run on an NVIDIA GPU when there is one, and otherwise in numba-cuda's CUDA
simulator (on the CPU, slowly: the tests use tiny shapes). Check your work with
``make test-chapter 9`` (or ``make test-exercise E=9.8``).
"""

from __future__ import annotations

from llmrs_core.labs.memory_pool import (
    PYTORCH_CONFIG,
    DeviceAllocator,
    PoolConfig,
    is_small,
    segment_size,
    should_split,
)

__all__: list[str] = []  # each exercise's region adds its names

# -- Exercise 9.7: a first CUDA kernel ------------------------------------------------

# Your kernels take numba.cuda from here: on your GPU, or in the CUDA simulator when the
# notebook or the tests chose it (they do so before this module is imported).
from llmrs_core.kernels.gpu import runtime  # noqa: E402

cuda = runtime.cuda()

__all__ += ["launch_rms_norm"]


def launch_rms_norm(x, weight, eps: float, out) -> None:
    """Write RMSNorm of every row of ``x`` into ``out``, with a numba.cuda kernel of your own.

    ``x [T, d]`` and ``out [T, d]`` float32, ``weight [d]`` float32: device arrays (CuPy on
    a GPU, NumPy in the simulator). Row ``r`` of the result is
    ``x[r] / sqrt(mean(x[r] ** 2) + eps) * weight`` (``llmrs_core.layers.rms_norm``).

    Write the kernel at module level (``@cuda.jit def rms_norm_kernel(x, weight, eps, out)``):
    one block per row (``cuda.blockIdx.x``); its threads (``cuda.threadIdx.x`` of
    ``cuda.blockDim.x``) stride over the row's columns, add up their squares, meet in a
    ``cuda.shared.array`` and sum it (``cuda.syncthreads()`` between the steps), then every
    thread writes its columns of ``out``. Launch it here:
    ``rms_norm_kernel[blocks, threads](x, weight, np.float32(eps), out)``. Any ``d`` must
    work, including one that is not a multiple of your block size.
    """
    raise NotImplementedError("Exercise 9.7 `launch_rms_norm`: not implemented yet — see ch09_gpu.ipynb §9.7")


# -- Exercise 9.8: dequantize-and-matvec ----------------------------------------------

__all__ += ["launch_q4_1_matvec"]


def launch_q4_1_matvec(qs, d, m, x, out) -> None:
    """Write ``x @ W.T`` into ``out`` straight from W's Q4_1 blocks, with a numba.cuda kernel of your own.

    ``W [rows, K]`` is stored as 32-weight blocks: ``qs [rows, K / 2]`` uint8 (block ``b`` of a
    row is bytes ``16 b .. 16 b + 15``; byte ``j`` holds weight ``j`` of the block in its low
    nibble and weight ``j + 16`` in its high nibble), ``d`` and ``m`` float32 ``[rows, K / 32]``
    (the scale and minimum of each block: ``w = d * q + m``). ``x [T, K]`` float32,
    ``out [T, rows]`` float32. All are device arrays.

    Never build ``W``: per block, ``w_b . x_b = d (q_b . x_b) + m sum(x_b)``. Cast each byte
    to ``np.int32`` before you shift or mask it (the simulator keeps ``uint8`` arithmetic
    in 8 bits; the GPU does not). Every row of ``out`` and every token must be written.
    """
    raise NotImplementedError("Exercise 9.8 `launch_q4_1_matvec`: not implemented yet — see ch09_gpu.ipynb §9.8")


# -- Exercise 9.9: a GPU memory pool --------------------------------------------------

__all__ += [
    "DeviceAllocator",
    "MemoryPool",
    "PoolConfig",
    "is_small",
    "round_size",
    "segment_size",
    "should_split",
]


def round_size(nbytes: int, config: PoolConfig = PYTORCH_CONFIG) -> int:
    """``nbytes`` rounded up to a multiple of ``config.min_block`` (512): every block's size.

    0 bytes still takes one block (512). A negative size, or one that is not an ``int``,
    raises ``ValueError``.
    """
    raise NotImplementedError("Exercise 9.9 `round_size`: not implemented yet — see ch09_gpu.ipynb §9.9")


class MemoryPool:
    """A caching allocator over a device: the core of PyTorch's ``CUDACachingAllocator``.

    ``device`` has ``malloc(n) -> ptr``, ``free(ptr)`` and ``mem_info()`` (a
    :class:`DeviceAllocator`; in the notebook and the tests a ``FakeDevice``). The rules:

    - **round** every request with :func:`round_size`;
    - **two pools**: a rounded size with ``is_small(size, config)`` (at most 1 MiB) is served
      only from small segments, any other only from large ones; keep one free list per pool;
    - **best fit**: take the smallest free block of the pool that fits (the lowest address
      among equal sizes); if none fits, ``device.malloc(segment_size(size, config))`` makes a
      new segment, which starts as one free block as large as itself;
    - **split**: if ``should_split(block_size, size, config)``, cut the block in two: the
      front ``size`` bytes are handed out, the rest stays free; otherwise hand out all of it;
    - **coalesce**: a freed block merges with the free blocks right before and after it in
      its segment (if ``config.coalesce``, which is True by default);
    - segments are never given back to the device (that is the reference's ``empty_cache``).

    One stream only; the reference (``llmrs_core.labs.memory_pool.CachingAllocator``)
    adds streams, events, the out-of-memory retry and ``empty_cache``.
    """

    def __init__(self, device: DeviceAllocator, config: PoolConfig = PYTORCH_CONFIG) -> None:
        raise NotImplementedError(
            "Exercise 9.9 `MemoryPool.__init__`: not implemented yet — see ch09_gpu.ipynb §9.9"
        )

    def malloc(self, nbytes: int) -> int:
        """Address of a block of ``round_size(nbytes)`` bytes (or more, where it was not split)."""
        raise NotImplementedError(
            "Exercise 9.9 `MemoryPool.malloc`: not implemented yet — see ch09_gpu.ipynb §9.9"
        )

    def free(self, ptr: int) -> None:
        """Return the block at ``ptr`` to its pool's free list, merged with free neighbours.

        An address that :meth:`malloc` did not return, or that was freed already, raises ``ValueError``.
        """
        raise NotImplementedError(
            "Exercise 9.9 `MemoryPool.free`: not implemented yet — see ch09_gpu.ipynb §9.9"
        )

    def stats(self) -> dict[str, int]:
        """The counters, as a dict with exactly these keys:

        ``allocated_bytes`` (sizes of the blocks handed out and not freed), ``peak_allocated_bytes``,
        ``reserved_bytes`` (sizes of the segments taken from the device), ``peak_reserved_bytes``,
        ``num_allocs`` and ``num_frees`` (calls), ``num_cache_hits`` (mallocs served without a
        ``device.malloc``), ``num_segments`` (segments held).
        """
        raise NotImplementedError(
            "Exercise 9.9 `MemoryPool.stats`: not implemented yet — see ch09_gpu.ipynb §9.9"
        )

    def segments(self) -> list[list[tuple[int, int, bool]]]:
        """Every segment, by address: its blocks in address order as ``(ptr, size, allocated)``."""
        raise NotImplementedError(
            "Exercise 9.9 `MemoryPool.segments`: not implemented yet — see ch09_gpu.ipynb §9.9"
        )
