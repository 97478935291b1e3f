"""The fusion pass on a real GPU, for ``scripts/gpu_check.py`` (chapter 9, §9.6).

``rows = check_on_gpu()`` runs residual add + RMSNorm and SwiGLU at SmolLM2's sizes three
ways on the device: eager CuPy (array expressions, one kernel per operator as eager
frameworks run them; CuPy has no one-kernel SiLU, so its SwiGLU takes five and its RMSNorm
eight), the generated CuPy kernels, and the generated numba.cuda kernel. Each is checked
against the NumPy layers and timed with ``cupyx.profiler.benchmark`` (median device time);
one dict per (block, T) with the normalised errors, whether they are within tolerance, the
times in microseconds and the byte model's figures. Needs a GPU.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import layers
from ..kernels.gpu import runtime
from ..testing import float32_tolerance, normalised_error
from . import fusion, fusion_codegen


def _median_us(result: Any) -> float:
    return float(np.median(result.gpu_times[0]) * 1e6)


def check_on_gpu(ts: tuple[int, ...] = (1, 512), repeat: int = 100) -> list[dict[str, Any]]:
    """See the module docstring; ``ts`` are the token counts (1: decode, 512: prefill)."""
    runtime.require_cuda("the fusion check")
    if runtime.simulator_enabled():
        raise runtime.CudaUnavailableError(
            "check_on_gpu times kernels on a GPU; it cannot run in the simulator"
        )
    import cupy
    from cupyx.profiler import benchmark

    rms = fusion.trace(fusion.residual_rms_norm, x="elem", residual="elem", weight="col")
    glu = fusion.trace(fusion.swiglu, gate="elem", up="elem")
    rng = np.random.default_rng(9)
    rows = []
    for t in ts:
        for label, graph, d in (("residual + RMSNorm", rms, 576), ("SwiGLU", glu, 1536)):
            a, b = (
                rng.standard_normal((t, d), dtype=np.float32),
                rng.standard_normal((t, d), dtype=np.float32),
            )
            w = rng.standard_normal(d, dtype=np.float32)
            da, db, dw = cupy.asarray(a), cupy.asarray(b), cupy.asarray(w)
            kernel = fusion_codegen.build_numba_kernel(graph, d)
            if graph is rms:
                want, tol = layers.rms_norm(a + b, w, 1e-5), float32_tolerance(d)
                inputs, out_name = {"x": da, "residual": db, "weight": dw}, "y"

                def eager(da=da, db=db, dw=dw):
                    h = da + db
                    return h, h * (1 / cupy.sqrt(cupy.mean(h * h, axis=-1, keepdims=True) + 1e-5)) * dw
            else:
                want, tol = layers.swiglu(a, b), float32_tolerance(1)
                inputs, out_name = {"gate": da, "up": db}, "out"

                def eager(da=da, db=db):
                    return da * (0.5 + 0.5 * cupy.tanh(0.5 * da)) * db

            out = {name: cupy.empty((t, d), dtype=cupy.float32) for name, _ in graph.outputs}
            got_numba = cupy.asnumpy(kernel(out=out, **inputs)[out_name])
            got_cupy = cupy.asnumpy(fusion_codegen.run_cupy(graph, cupy, **inputs)[out_name])
            err_numba, err_cupy = normalised_error(got_numba, want), normalised_error(got_cupy, want)
            rows.append(
                {
                    "block": label, "T": t, "D": d,
                    "error_numba": err_numba, "error_cupy": err_cupy, "tolerance": tol,
                    "ok": err_numba <= tol and err_cupy <= tol,
                    "eager_us": _median_us(benchmark(eager, (), n_repeat=repeat)),
                    "cupy_kernels_us": _median_us(
                        benchmark(lambda g=graph, i=inputs: fusion_codegen.run_cupy(g, cupy, **i), (), n_repeat=repeat)
                    ),
                    "numba_kernel_us": _median_us(
                        benchmark(lambda k=kernel, o=out, i=inputs: k(out=o, **i), (), n_repeat=repeat)
                    ),
                    "bytes_eager": fusion.traffic(fusion.eager_plan(graph), t, d).bytes_moved,
                    "bytes_fused": fusion.traffic(fusion.fused_plan(graph), t, d).bytes_moved,
                }
            )  # fmt: skip
    return rows


__all__ = ["check_on_gpu"]
