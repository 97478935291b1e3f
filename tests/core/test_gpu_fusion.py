"""The fusion pass without a GPU: tracing, launch and byte counts, generated source (no numba.cuda here).

Counts are derived by hand from the byte model (each kernel reads each input array once and
writes each output once, float32): for residual add + RMSNorm on [T, D], HF's eager
``LlamaRMSNorm`` is seven kernels (add, pow, mean, add eps, rsqrt, mul, mul by the weight);
fused it is one. Values are checked against the engine's NumPy layers
(``llmrs_core.layers``), which the NumPy backend runs.
"""

from __future__ import annotations

import ast
import re

import numpy as np
import pytest

from llmrs_core import layers
from llmrs_core.labs import fusion as F
from llmrs_core.labs import fusion_codegen as C
from llmrs_core.testing import float32_tolerance, normalised_error

SHAPES = [(1, 64), (3, 40), (7, 576)]


def rms_graph():
    return F.trace(F.residual_rms_norm, x="elem", residual="elem", weight="col")


def swiglu_graph():
    return F.trace(F.swiglu, gate="elem", up="elem")


def draw(t, d, seed):
    rng = np.random.default_rng(seed)
    return (
        rng.standard_normal((t, d), dtype=np.float32),
        rng.standard_normal((t, d), dtype=np.float32),
        rng.standard_normal(d, dtype=np.float32),
    )


def test_trace_records_the_eager_ops_of_rms_norm():
    g = rms_graph()
    assert [n.op for n in g.ops] == ["add", "square", "mean", "add", "rsqrt", "mul", "mul"]
    assert [n.kind for n in g.ops] == ["elem", "elem", "row", "row", "row", "elem", "elem"]
    assert [(n.name, n.kind) for n in g.inputs] == [("x", "elem"), ("residual", "elem"), ("weight", "col")]
    assert [name for name, _ in g.outputs] == ["h", "y"]
    assert "v5 = mean(v4)" in g.describe()


@pytest.mark.parametrize(("t", "d"), SHAPES)
def test_residual_rms_norm_counts_from_first_principles(t, d):
    g = rms_graph()
    # eager, in float32 elements: add 2TD+TD, square TD+TD, mean TD+T, +eps T+T, rsqrt T+T,
    # h*rs TD+T+TD, *weight TD+D+TD = 10TD + 6T + D
    assert F.traffic(F.eager_plan(g), t, d) == F.Traffic(
        7, 4 * (6 * t * d + 3 * t + d), 4 * (4 * t * d + 3 * t)
    )
    assert F.traffic(F.eager_plan(g), t, d).bytes_moved == 4 * (10 * t * d + 6 * t + d)
    # fused: read x, residual, weight; write h, y
    assert F.traffic(F.fused_plan(g), t, d) == F.Traffic(1, 4 * (2 * t * d + d), 4 * 2 * t * d)
    # CuPy: a ReductionKernel (reads x, residual; writes T) and an ElementwiseKernel that reads
    # x, residual, weight and the row value, and writes h, y
    assert F.traffic(C.cupy_plan(g), t, d) == F.Traffic(2, 4 * (4 * t * d + d + t), 4 * (2 * t * d + t))


@pytest.mark.parametrize(("t", "d"), SHAPES)
def test_swiglu_counts_from_first_principles(t, d):
    g = swiglu_graph()
    assert F.traffic(F.eager_plan(g), t, d) == F.Traffic(2, 4 * 3 * t * d, 4 * 2 * t * d)  # silu; mul
    assert F.traffic(F.fused_plan(g), t, d) == F.Traffic(1, 4 * 2 * t * d, 4 * t * d)
    assert F.traffic(C.cupy_plan(g), t, d) == F.traffic(F.fused_plan(g), t, d)


@pytest.mark.parametrize(("t", "d"), SHAPES)
def test_eager_and_fused_numpy_match_the_layers(t, d):
    x, r, w = draw(t, d, seed=t * 1000 + d)
    g = rms_graph()
    want_y, want_h = layers.rms_norm(x + r, w, 1e-5), x + r
    eager, measured = F.run_eager(g, {"x": x, "residual": r, "weight": w})
    assert measured == F.traffic(F.eager_plan(g), t, d), "the arrays NumPy touched match the plan's count"
    fused = C.numpy_fused(g)(x=x, residual=r, weight=w)
    tol = float32_tolerance(d)
    for got in (eager, fused):
        np.testing.assert_array_equal(got["h"], want_h)
        assert got["y"].dtype == np.float32 and normalised_error(got["y"], want_y) <= tol
    g2 = swiglu_graph()
    eager2, measured2 = F.run_eager(g2, {"gate": x, "up": r})
    assert measured2 == F.traffic(F.eager_plan(g2), t, d)
    for got in (eager2["out"], C.numpy_fused(g2)(gate=x, up=r)["out"]):
        assert normalised_error(got, layers.swiglu(x, r)) <= float32_tolerance(1)


def _c_identifiers(code: str) -> set[str]:
    code = re.sub(r"\b\d+(\.\d*)?(e[-+]?\d+)?f?\b", " ", code)  # number literals
    return set(re.findall(r"[A-Za-z_]\w*", code))


def test_cupy_source_of_residual_rms_norm():
    reduction, elementwise = C.cupy_kernels(rms_graph())
    assert reduction.kind == "reduction" and reduction.in_params == "float32 x, float32 residual"
    assert reduction.map_expr == "((x + residual) * (x + residual))"
    assert (reduction.reduce_expr, reduction.identity, reduction.out_params) == ("a + b", "0", "float32 out0")
    assert "_in_ind.size() / _out_ind.size()" in reduction.post_map_expr, "a mean: the sum over D"
    assert elementwise.kind == "elementwise"
    assert elementwise.in_params == "float32 x, float32 residual, float32 weight, float32 rowv"
    assert elementwise.out_params == "float32 h, float32 y"
    statements = elementwise.operation.splitlines()
    assert statements[-2:] == ["h = v3;", "y = v10;"], "each output assigned once, at the end"
    declared = [m.group(1) for s in statements if (m := re.match(r"float (v\d+) = ", s))]
    assert len(declared) == len(set(declared)) == 5, (
        "add, +eps, rsqrt and two muls; the reduction's square is not"
    )
    known = {"x", "residual", "weight", "rowv", "h", "y", "float", "rsqrtf"}
    for i, s in enumerate(statements):
        assert s.count("(") == s.count(")") and s.endswith(";"), s
        undefined = _c_identifiers(s) - known - set(declared[:i]) - {declared[i] if i < len(declared) else ""}
        assert not undefined, f"{s!r} uses {undefined} before it is defined"


def test_cupy_source_of_swiglu_is_one_elementwise_kernel():
    (kernel,) = C.cupy_kernels(swiglu_graph())
    assert (kernel.kind, kernel.in_params, kernel.out_params) == (
        "elementwise",
        "float32 gate, float32 up",
        "float32 out",
    )
    assert kernel.operation.splitlines() == [
        "float v2 = (gate * (0.5f + 0.5f * tanhf(0.5f * gate)));",
        "float v3 = (v2 * up);",
        "out = v3;",
    ]


def test_numba_source_is_one_kernel_with_one_reduction():
    src = C.numba_source(rms_graph(), d=40, threads=32)
    tree = ast.parse(src)
    (fn,) = tree.body
    assert [a.arg for a in fn.args.args] == ["x", "residual", "weight", "out_h", "out_y"]
    assert src.count("cuda.syncthreads()") == 3, (
        "after the partial sums, in the tree, and before the next row"
    )
    assert "cuda.shared.array(32, float32)" in src and "cuda.shared.array(40, float32)" in src, (
        "a partial sum per thread; h staged for the second pass"
    )
    assert src.count("x[row, j]") == 1 and src.count("residual[row, j]") == 1, "inputs read once"
    assert src.count("out_h[row, j] =") == 1 and src.count("out_y[row, j] =") == 1
    assert C.numba_signature(rms_graph()) == (
        "void(float32[:, :], float32[:, :], float32[:], float32[:, :], float32[:, :])"
    )
    swiglu = C.numba_source(swiglu_graph(), d=40, threads=32)
    assert "syncthreads" not in swiglu and "shared" not in swiglu, "no reduction, no barrier"
    with pytest.raises(ValueError, match="power of two"):
        C.numba_source(rms_graph(), d=40, threads=48)


def test_bad_graphs_and_inputs_are_refused():
    with pytest.raises(ValueError, match="kind must be"):
        F.trace(F.swiglu, gate="row", up="elem")
    with pytest.raises(ValueError, match="outputs must be"):
        F.trace(lambda x: {"s": x.mean()}, x="elem")
    with pytest.raises(NotImplementedError, match="at most one row reduction"):
        F.trace(lambda x: {"y": x * x.mean() * x.sum()}, x="elem")
    with pytest.raises(TypeError, match="traced values and Python numbers"):
        F.trace(lambda x: {"y": x * "2"}, x="elem")
    with pytest.raises(ValueError, match="constants must be finite"):
        F.trace(lambda x: {"y": x * float("inf")}, x="elem")
    with pytest.raises(ValueError, match="reduces the columns"):
        F.trace(lambda x, w: {"y": x * w.mean()}, x="elem", w="col")
    for bad in ("v3", "out_h", "_x", "row", "i", "not an identifier"):
        with pytest.raises(ValueError, match="cannot be used in generated code"):
            F.trace(lambda **kw: {"y": next(iter(kw.values())) * 2.0}, **{bad: "elem"})
    with pytest.raises(ValueError, match="has the name of an input"):
        F.trace(lambda x: {"x": x * 2.0}, x="elem")
    g = rms_graph()
    x, r, w = draw(2, 8, seed=1)
    with pytest.raises(ValueError, match="inputs are"):
        F.run_eager(g, {"x": x, "residual": r})
    with pytest.raises(ValueError, match="'weight' \\(col\\) must be float32 of shape \\(8,\\)"):
        F.run_eager(g, {"x": x, "residual": r, "weight": w[:4]})
    with pytest.raises(ValueError, match="must be float32"):
        F.run_eager(g, {"x": x.astype(np.float64), "residual": r, "weight": w})


def test_cupy_kernels_are_built_with_their_source_once():
    class FakeCupy:
        made: list = []

        @classmethod
        def ElementwiseKernel(cls, *args):  # noqa: N802 - CuPy's name
            cls.made.append(("elementwise", args))
            return len(cls.made)

        @classmethod
        def ReductionKernel(cls, *args):  # noqa: N802
            cls.made.append(("reduction", args))
            return len(cls.made)

    reduction, elementwise = C.cupy_kernels(rms_graph())
    assert elementwise.build(FakeCupy) == elementwise.build(FakeCupy) == 1, "built once, then cached"
    assert FakeCupy.made[0] == (
        "elementwise",
        (elementwise.in_params, elementwise.out_params, elementwise.operation, "fused"),
    )
    reduction.build(FakeCupy)
    assert FakeCupy.made[1] == (
        "reduction",
        ("float32 x, float32 residual", "float32 out0", reduction.map_expr, "a + b", reduction.post_map_expr,
         "0", "fused_mean"),
    )  # fmt: skip
