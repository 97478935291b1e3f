"""Exercise 8.7 — Parallel Matmul with prange: the Q4 matvec with its groups of rows shared
among Numba's threads. No timing here (a shared machine makes timings flaky): correctness,
independence from the thread count, and that the kernel really is a parallel Numba loop."""

from __future__ import annotations

import inspect

import numba
import numpy as np
import pytest
from numba import njit
from numba.core.registry import CPUDispatcher

from llmrs_core.kernels.cpu.packing import pack_q8
from llmrs_core.kernels.cpu.threads import max_threads
from llmrs_core.testing import (
    assert_matches,
    float32_tolerance,
    normalised_error,
    q4_matvec_variants,
    random_q4,
)

# Numba's own warning for a parallel=True function without prange; the test below says it kindly
pytestmark = pytest.mark.filterwarnings("ignore::numba.core.errors.NumbaPerformanceWarning")

SHAPES = [(32, 32), (100, 64), (7, 320), (1536, 576)]
# against the float64 product: about sqrt(cols) * 2^-24 of the largest output (float32_tolerance)
TWO = min(2, max_threads())


@pytest.mark.parametrize("rows, cols", SHAPES)
def test_ex8_7_matches_the_dequantised_product(ex, rows, cols, compiled):
    w, dense = random_q4(rows, cols, seed=rows * cols)
    x = np.random.default_rng(3).standard_normal(cols).astype(np.float32)
    y = compiled("q4_matvec_parallel", ex.parallel_matvec, w, x, TWO)
    assert isinstance(y, np.ndarray) and y.shape == (rows,) and y.dtype == np.float32, (
        f"parallel_matvec should return float32 of shape ({rows},); got "
        f"{getattr(y, 'dtype', type(y).__name__)} {getattr(y, 'shape', '')}"
    )
    assert_matches(y, dense @ x.astype(np.float64), q4_matvec_variants(w, x),
                   what=f"your parallel_matvec [{rows}, {cols}] on {TWO} threads", axes=("row",),
                   tol=float32_tolerance(cols),
                   note=". If Exercise 8.6 passes, look at what the threads share: accumulators created outside "
                   "the prange body are written by all threads at once.")


def test_ex8_7_same_result_on_one_and_two_threads(ex, compiled):
    if max_threads() < 2:
        pytest.skip("Numba may use only 1 thread here (NUMBA_NUM_THREADS=1 or a 1-core machine)")
    w, _ = random_q4(1536, 576, seed=7)
    x = np.random.default_rng(4).standard_normal(576).astype(np.float32)
    one, two = compiled("q4_matvec_parallel", ex.parallel_matvec, w, x, 1), compiled("q4_matvec_parallel", ex.parallel_matvec, w, x, 2)
    diff = float(np.abs(one - two).max() / np.abs(one).max())
    # a kernel as asked sums every row in one order whatever the thread count: exactly 0 here;
    # threads racing on a shared accumulator give differences of order 1. 1e-6 is no rounding
    # allowance, just a line between the two
    assert diff <= 1e-6, (
        f"1 and 2 threads disagree (normalised difference {diff:.2e}). Each group of rows should "
        "be computed by one thread from start to end, so the thread count cannot change it; a "
        "difference means threads share something they write."
    )


def test_ex8_7_puts_the_thread_count_back(ex, compiled):
    w, _ = random_q4(64, 64, seed=8)
    x = np.ones(64, np.float32)
    before = numba.get_num_threads()
    compiled("q4_matvec_parallel", ex.parallel_matvec, w, x, 1)
    assert numba.get_num_threads() == before, (
        f"after parallel_matvec(..., threads=1) Numba runs on {numba.get_num_threads()} threads, "
        f"it ran on {before} before: put the previous number back (in a finally)"
    )


def test_ex8_7_rejects_impossible_thread_counts_and_inputs(ex, compiled):
    w, _ = random_q4(64, 64, seed=9)
    x = np.ones(64, np.float32)
    compiled("q4_matvec_parallel", ex.parallel_matvec, w, x, 1)  # a stub stops here, with its message
    for threads in (0, max_threads() + 1):
        with pytest.raises(ValueError):
            ex.parallel_matvec(w, x, threads)
    with pytest.raises(ValueError):
        ex.parallel_matvec(w, x[:32], 1)
    q8 = pack_q8(np.ones((32, 64), np.int8), np.ones((32, 2), np.float32), "q8")
    with pytest.raises(ValueError):
        ex.parallel_matvec(q8, x, 1)


def test_ex8_7_kernel_is_a_parallel_loop(ex, compiled):
    w, _ = random_q4(64, 64, seed=10)
    x = np.ones(64, np.float32)
    compiled("q4_matvec_parallel", ex.parallel_matvec, w, x, 1)
    kernel = ex.q4_matvec_parallel
    assert isinstance(kernel, CPUDispatcher), (
        "q4_matvec_parallel is not compiled by Numba: decorate it with @njit(parallel=True, fastmath=True)"
    )
    assert kernel.targetoptions.get("parallel"), (
        "q4_matvec_parallel is compiled without parallel=True: prange then runs as a plain range "
        "on one thread. Use @njit(parallel=True, fastmath=True)."
    )
    assert "prange" in inspect.getsource(kernel.py_func), (
        "q4_matvec_parallel has no prange loop: write the loop over groups as `for g in prange(groups)`"
    )
    # compile a fresh copy (a cached kernel keeps no compilation report) and ask Numba what it made parallel
    options = {k: v for k, v in kernel.targetoptions.items() if k in ("parallel", "fastmath")}
    fresh = njit(**options)(kernel.py_func)
    fresh(w.qs, w.d, w.m, x)
    report = fresh.get_metadata(fresh.signatures[0])["parfor_diagnostics"]
    assert report.count_parfors() > 0, (
        "Numba turned no loop of q4_matvec_parallel into a parallel loop; see "
        "`q4_matvec_parallel.parallel_diagnostics(level=1)` for why"
    )


def test_ex8_7_parallel_kernel_alone_covers_every_group(ex, compiled):
    w, dense = random_q4(96, 64, seed=11)
    x = np.random.default_rng(5).standard_normal(64).astype(np.float32)
    out = compiled("q4_matvec_parallel", ex.q4_matvec_parallel, w.qs, w.d, w.m, x)
    assert out.shape == (w.qs.shape[0] * 32,), (
        f"q4_matvec_parallel returns one value per row of every group: ({w.qs.shape[0] * 32},), "
        f"got {out.shape}"
    )
    err = normalised_error(out[: w.rows], dense @ x.astype(np.float64))
    assert err <= float32_tolerance(64), f"the kernel's rows differ from x @ W.T (normalised error {err:.2e})"

