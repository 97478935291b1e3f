"""Exercise 9.7 — a first CUDA kernel: RMSNorm, one block per row.

Reference: the engine's NumPy RMSNorm (``llmrs_core.layers.rms_norm``). The output is
filled with NaN before your kernel runs, so a row or a column it never wrote shows up.
Shapes are tiny: in the simulator every CUDA thread is a Python thread.
"""

from __future__ import annotations

import numpy as np
import pytest

from llmrs_core import layers
from llmrs_core.kernels.gpu.arrays import to_device, to_host, xp
from llmrs_core.testing import float32_tolerance, normalised_error


def run(ex, x: np.ndarray, weight: np.ndarray, eps: float = 1e-5) -> np.ndarray:
    out = xp().empty(x.shape, np.float32)
    out[...] = np.nan
    ex.launch_rms_norm(to_device(x), to_device(weight), eps, out)
    return to_host(out)


def check(got: np.ndarray, x: np.ndarray, weight: np.ndarray, eps: float = 1e-5) -> None:
    want = layers.rms_norm(x, weight, eps)
    for r in range(x.shape[0]):
        missing = np.flatnonzero(np.isnan(got[r]))
        if missing.size == x.shape[1]:
            pytest.fail(f"row {r}: your kernel left the output untouched — did every row get a block "
                        "(cuda.blockIdx.x), and did its threads write out[row, k]?")
        if missing.size:
            pytest.fail(f"row {r}: columns {missing[:6].tolist()}... were never written — the threads' loop "
                        f"over the row must go up to d = {x.shape[1]} in steps of cuda.blockDim.x")
        err = normalised_error(got[r], want[r])
        if err > float32_tolerance(x.shape[1]):
            x64, w64 = x[r].astype(np.float64), weight.astype(np.float64)
            square_sum = float(np.sum(x64 * x64))
            variants = {  # the usual mistakes, each computed from this row in float64
                "the sum of squares was not divided by d: RMSNorm uses the MEAN of the squares, sum / d":
                    x64 / np.sqrt(square_sum + eps) * w64,
                "eps was added after the square root: it goes inside, x / sqrt(mean(x ** 2) + eps)":
                    x64 / (np.sqrt(square_sum / x.shape[1]) + eps) * w64,
                "the result is off by the weight — multiply x[row, k] * inv_rms by weight[k] once":
                    x64 / np.sqrt(square_sum / x.shape[1] + eps),
            }
            for hint, variant in variants.items():  # a mistake explains the row: far closer to it than to the reference
                if normalised_error(got[r], variant) <= min(1e-3, err / 10):
                    pytest.fail(f"row {r}: {hint}")
            ratio = got[r] / want[r]
            if np.allclose(ratio, ratio[0], rtol=1e-3):
                pytest.fail(f"row {r}: every value is {ratio[0]:.4g} times the reference — is the sum of squares "
                            "complete? Every thread's partial sum goes into the shared array, and after "
                            "cuda.syncthreads() all cuda.blockDim.x of them are added, not only some")
            if np.allclose(got[r] / weight, want[r], rtol=1e-3):
                pytest.fail(f"row {r}: the result is off by the weight — multiply x[row, k] * inv_rms by weight[k] once")
            worst = int(np.argmax(np.abs(got[r] - want[r])))
            pytest.fail(f"row {r}: normalised error {err:.2e} (allowed {float32_tolerance(x.shape[1]):.1e}); worst "
                        f"at column {worst}: {got[r, worst]:.5g} instead of {want[r, worst]:.5g}")


def test_ex9_7_one_row(ex):
    rng = np.random.default_rng()
    x = rng.standard_normal((1, 64)).astype(np.float32)
    weight = (1 + 0.1 * rng.standard_normal(64)).astype(np.float32)
    check(run(ex, x, weight), x, weight)


def test_ex9_7_several_rows_of_an_odd_width(ex):
    """A width that is no multiple of a block size: the stride loop's last lap is partial."""
    rng = np.random.default_rng()
    x = (3 * rng.standard_normal((4, 200))).astype(np.float32)
    weight = rng.standard_normal(200).astype(np.float32)
    check(run(ex, x, weight), x, weight)


def test_ex9_7_eps_matters_for_a_zero_row(ex):
    x = np.zeros((2, 32), np.float32)
    x[1] = 1e-4
    weight = np.ones(32, np.float32)
    got = run(ex, x, weight, eps=1e-2)
    assert not np.isnan(got).any(), "a NaN: is eps added before the square root? (a zero row divides 0 by 0 otherwise)"
    check(got, x, weight, eps=1e-2)
