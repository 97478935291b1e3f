"""The fused kernels generated from traced graphs, run (simulator or GPU) against the unfused NumPy layers.

References: ``llmrs_core.layers.rms_norm`` and ``swiglu`` (the NumPy backend's layers),
applied op by op. Inputs are drawn fresh per shape; outputs start as NaN, so an element the
kernel never writes fails the comparison. Tiny shapes: the simulator runs each thread in
Python. The generated kernels are also compiled for sm_90 with ``compile_ptx``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from llmrs_core import layers
from llmrs_core.kernels.gpu import runtime
from llmrs_core.kernels.gpu.arrays import to_device, to_host
from llmrs_core.labs import fusion as F
from llmrs_core.labs import fusion_codegen as C
from llmrs_core.testing import float32_tolerance, normalised_error

SHAPES = [(3, 64), (2, 40)]  # D = 40: threads stride past the row's end


@pytest.mark.parametrize(("t", "d"), SHAPES)
def test_fused_residual_rms_norm_kernel_matches_the_unfused_layers(t, d):
    rng = np.random.default_rng([t, d])
    x, r = rng.standard_normal((t, d), dtype=np.float32), rng.standard_normal((t, d), dtype=np.float32)
    w = rng.standard_normal(d, dtype=np.float32)
    kernel = C.build_numba_kernel(F.trace(F.residual_rms_norm, x="elem", residual="elem", weight="col"), d)
    out = kernel(x=to_device(x), residual=to_device(r), weight=to_device(w))
    np.testing.assert_array_equal(to_host(out["h"]), x + r)
    y = to_host(out["y"])
    assert not np.isnan(y).any(), "the kernel left elements of y unwritten"
    assert normalised_error(y, layers.rms_norm(x + r, w, 1e-5)) <= float32_tolerance(d)


@pytest.mark.parametrize(("t", "d"), SHAPES)
def test_fused_swiglu_kernel_matches_the_unfused_layers(t, d):
    rng = np.random.default_rng([t, d, 1])
    gate, up = rng.standard_normal((t, d), dtype=np.float32), rng.standard_normal((t, d), dtype=np.float32)
    kernel = C.build_numba_kernel(F.trace(F.swiglu, gate="elem", up="elem"), d)
    out = to_host(kernel(gate=to_device(gate), up=to_device(up))["out"])
    assert not np.isnan(out).any()
    assert normalised_error(out, layers.swiglu(gate, up)) <= float32_tolerance(1)


def test_outputs_given_or_refused():
    kernel = C.build_numba_kernel(F.trace(F.swiglu, gate="elem", up="elem"), 40)
    gate, up = np.full((2, 40), 1.5, dtype=np.float32), np.full((2, 40), -2.0, dtype=np.float32)
    out = {"out": to_device(np.full((2, 40), np.nan, dtype=np.float32))}
    assert kernel(out=out, gate=to_device(gate), up=to_device(up))["out"] is out["out"], "writes into out"
    assert normalised_error(to_host(out["out"]), layers.swiglu(gate, up)) <= float32_tolerance(1)
    with pytest.raises(ValueError, match=r"out must map \['out'\] to \[2, 40\] arrays"):
        kernel(out={"y": out["out"]}, gate=to_device(gate), up=to_device(up))
    z = to_device(np.zeros((2, 64), dtype=np.float32))
    with pytest.raises(ValueError, match="rows of 40 columns, not 64"):
        kernel(gate=z, up=z)


COMPILE = textwrap.dedent(
    """
    import os
    os.environ["NUMBA_FORCE_CUDA_CC"] = "9.0"  # name the target: no NVRTC query (as compile_check does)
    from llmrs_core.kernels.gpu import runtime
    from llmrs_core.labs import fusion as F, fusion_codegen as C
    cuda = runtime.cuda()  # numba.cuda with the engine's settings (NumPy 2.5's row_stack)
    for block, kinds in ((F.residual_rms_norm, dict(x="elem", residual="elem", weight="col")),
                         (F.swiglu, dict(gate="elem", up="elem"))):
        g = F.trace(block, **kinds)
        cuda.compile_ptx(C.numba_function(g, 576, 128, cuda), C.numba_signature(g), cc=(9, 0))
        print("ok", block.__name__)
    """
)


def test_the_generated_kernels_compile_for_sm_90():
    # in a process of its own: this one may run the simulator, and the forced target must not leak
    env = {k: v for k, v in os.environ.items() if k != runtime.SIMULATOR_ENV}
    proc = subprocess.run(
        [sys.executable, "-c", COMPILE], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, f"compile_ptx failed:\n{proc.stderr[-3000:]}"
    assert proc.stdout.split() == ["ok", "residual_rms_norm", "ok", "swiglu"]


def several_staged_values(x, r, w):
    """A graph with several [T, D] values for the second pass, a sum (not a mean), and weight ops."""
    a, b = x * r, x - r
    s = (a * b).sum()
    return {"y": a * s + b * w, "z": (w * 2.0) * b - s}


def test_a_kernel_with_several_staged_values_and_a_sum():
    rng = np.random.default_rng(7)
    t, d = 3, 40
    x, r = rng.standard_normal((t, d), dtype=np.float32), rng.standard_normal((t, d), dtype=np.float32)
    w = rng.standard_normal(d, dtype=np.float32)
    a, b = x * r, x - r
    s = (a * b).sum(axis=-1, keepdims=True)
    want = {"y": a * s + b * w, "z": (w * 2) * b - s}  # the formula, in NumPy
    graph = F.trace(several_staged_values, x="elem", r="elem", w="col")
    # pass 1 computes a, b * w and (w * 2) * b, which do not need the sum, and stages them for pass 2
    assert [n.op for n in C.passes(graph).staged] == ["mul", "mul", "mul"]
    out = C.build_numba_kernel(graph, d)(x=to_device(x), r=to_device(r), w=to_device(w))
    for name in want:
        assert normalised_error(to_host(out[name]), want[name]) <= float32_tolerance(d), name
