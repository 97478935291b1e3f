"""Code generation for the fusion pass: one kernel from a traced graph (chapter 9, §9.6).

From one :class:`~llmrs_core.labs.fusion.Graph` (at most one row reduction), three
renderings of the same statements:

- :func:`numba_source` / :func:`build_numba_kernel`: **one numba.cuda kernel**. A thread
  block takes a row (striding over rows); pass 1 computes, column by column, everything that
  does not depend on the reduction, writes the outputs it can, keeps in shared memory the
  values pass 2 needs, and sums the reduced value; a tree in shared memory finishes the sum;
  pass 2 computes the rest. Inputs are read once, outputs written once: one launch.
- :func:`cupy_kernels`: **CuPy** ``ReductionKernel`` + ``ElementwiseKernel`` source (or one
  ``ElementwiseKernel`` when there is no reduction). CuPy cannot put a row reduction and
  elementwise outputs in one kernel, so with a reduction this is two launches, the second
  re-reading the inputs: :func:`cupy_plan` counts that.
- :func:`numpy_source` / :func:`numpy_fused`: the fused statements as one vectorised NumPy
  function, so the generated expressions are checked on a machine with no GPU.

Element type float32 throughout: the numba code casts every intermediate back to float32
(as compiled CUDA does with float32 operands), and the C code uses float intrinsics.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .fusion import REDUCE, Graph, KernelIO, Node, check_inputs

# op -> template over argument expressions {0}, {1}, per target
C_OPS = {
    "add": "({0} + {1})", "sub": "({0} - {1})", "mul": "({0} * {1})", "div": "({0} / {1})",
    "neg": "(-{0})", "square": "({0} * {0})", "exp": "expf({0})", "rsqrt": "rsqrtf({0})",
    "silu": "({0} * (0.5f + 0.5f * tanhf(0.5f * {0})))",
}  # fmt: skip
PY_OPS = {
    "add": "{0} + {1}", "sub": "{0} - {1}", "mul": "{0} * {1}", "div": "{0} / {1}",
    "neg": "-{0}", "square": "{0} * {0}", "exp": "math.exp({0})", "rsqrt": "float32(1.0) / math.sqrt({0})",
    "silu": "{0} * (float32(0.5) + float32(0.5) * math.tanh(float32(0.5) * {0}))",
}  # fmt: skip
NP_OPS = {
    "add": "{0} + {1}", "sub": "{0} - {1}", "mul": "{0} * {1}", "div": "{0} / {1}",
    "neg": "-{0}", "square": "{0} * {0}", "exp": "np.exp({0})", "rsqrt": "np.float32(1.0) / np.sqrt({0})",
    "silu": "{0} * (np.float32(0.5) + np.float32(0.5) * np.tanh(np.float32(0.5) * {0}))",
}  # fmt: skip


@dataclass(frozen=True)
class Passes:
    """How the one-kernel code splits the graph around its reduction (if any)."""

    reduction: Node | None
    first: tuple[Node, ...]  # per-column values not depending on the reduction
    rows: tuple[Node, ...]  # per-row values: the reduction and what follows from it
    second: tuple[Node, ...]  # per-column values that depend on the reduction
    staged: tuple[Node, ...]  # [T, D] values of the first pass that the second needs


def passes(graph: Graph) -> Passes:
    """Split ``graph``'s op nodes into the passes of the one-kernel code."""
    reduction = next((n for n in graph.nodes if n.op in REDUCE), None)
    after: set[int] = set()
    for n in graph.nodes:
        if n is reduction or any(a in after for a in n.args):
            after.add(n.id)
    computed = [n for n in graph.nodes if n.op != "const" and n.kind != "scalar"]
    first = tuple(n for n in computed if n.id not in after and n.kind in ("elem", "col"))
    rows = tuple(n for n in computed if n.id in after and n.kind == "row")
    second = tuple(n for n in computed if n.id in after and n.kind in ("elem", "col"))
    needed = {a for n in second for a in n.args}
    staged = tuple(n for n in first if n.kind == "elem" and n.id in needed)
    if any(n.kind == "scalar" and n.op != "const" for n in graph.nodes):
        raise NotImplementedError("fold arithmetic on constants before tracing (a scalar op was traced)")
    return Passes(reduction, first, rows, second, staged)


def _expr(graph: Graph, n: Node, ops: Mapping[str, str], ref: Callable[[Node], str]) -> str:
    return ops[n.op].format(*(ref(graph.nodes[a]) for a in n.args))


# -- numba.cuda ---------------------------------------------------------------------------------


def numba_source(graph: Graph, d: int, threads: int, name: str = "fused") -> str:
    """Python source of one numba.cuda kernel for ``graph`` on rows of ``d`` columns.

    Arguments: the graph's inputs in order, then ``out_<name>`` for each output. ``threads``
    (a power of two) is the block size the tree reduction is written for.
    """
    if threads < 1 or threads & (threads - 1):
        raise ValueError(f"threads must be a power of two, not {threads}")
    p = passes(graph)
    staged = {n.id: k for k, n in enumerate(p.staged)}
    outputs = {i: f"out_{name_}" for name_, i in graph.outputs}
    params = [n.name for n in graph.inputs] + list(outputs.values())

    def ref(n: Node) -> str:
        return f"float32({n.value!r})" if n.op == "const" else f"v{n.id}"

    def column_pass(nodes, stage_reads: bool) -> list[str]:
        lines = []
        if stage_reads:  # the second pass reads the first pass's [T, D] values back from shared memory
            needed = ancestors(
                graph, [a for n in nodes for a in n.args], stop=set(staged) | {n.id for n in p.rows}
            )
            lines += [f"v{i} = stage[{k * d} + j]" for i, k in staged.items() if i in needed]
            nodes = [n for n in p.first if n.kind == "col" and n.id in needed] + list(
                nodes
            )  # re-read weights
        for n in nodes:
            if n.op == "input":
                lines.append(f"v{n.id} = {n.name}[row, j]" if n.kind == "elem" else f"v{n.id} = {n.name}[j]")
            elif n.op not in REDUCE:
                lines.append(f"v{n.id} = float32({_expr(graph, n, PY_OPS, ref)})")
            if n.id in outputs and n.kind == "elem":
                lines.append(f"{outputs[n.id]}[row, j] = v{n.id}")
            if not stage_reads and n.id in staged:
                lines.append(f"stage[{staged[n.id] * d} + j] = v{n.id}")
        if not stage_reads and p.reduction is not None:
            lines.append(f"acc += v{p.reduction.args[0]}")
        return lines

    body = [f"for row in range(cuda.blockIdx.x, {graph_rows(graph)}.shape[0], cuda.gridDim.x):"]
    if p.reduction is not None:
        body.append("    acc = float32(0.0)")
    body.append(f"    for j in range(tid, {d}, {threads}):")
    wanted = [i for _, i in graph.outputs] + list(staged) + ([p.reduction.args[0]] if p.reduction else [])
    first = ancestors(graph, wanted, stop={n.id for n in p.second} | {n.id for n in p.rows})
    body += ["        " + line for line in column_pass([n for n in p.first if n.id in first], False)]
    if p.reduction is not None:
        r = p.reduction
        body += [
            "    partial[tid] = acc",
            "    cuda.syncthreads()",
            f"    stride = {threads // 2}",
            "    while stride > 0:",
            "        if tid < stride:",
            "            partial[tid] += partial[tid + stride]",
            "        cuda.syncthreads()",
            "        stride //= 2",
            f"    v{r.id} = float32(partial[0] / float32({d}))"
            if r.op == "mean"
            else f"    v{r.id} = partial[0]",
        ]
        body += [f"    v{n.id} = float32({_expr(graph, n, PY_OPS, ref)})" for n in p.rows if n is not r]
        body.append(f"    for j in range(tid, {d}, {threads}):")
        body += ["        " + line for line in column_pass(p.second, True)]
        body.append("    cuda.syncthreads()  # partial and stage are reused by the next row")
    head = [f"def {name}({', '.join(params)}):", "    tid = cuda.threadIdx.x"]
    if p.reduction is not None:
        head.append(f"    partial = cuda.shared.array({threads}, float32)")
        if p.staged:
            head.append(f"    stage = cuda.shared.array({len(p.staged) * d}, float32)")
    return "\n".join(head + ["    " + line for line in body]) + "\n"


def graph_rows(graph: Graph) -> str:
    """The name of an input that has the rows (the first ``[T, D]`` input)."""
    return next(n.name for n in graph.inputs if n.kind == "elem")


def numba_signature(graph: Graph) -> str:
    """The kernel's numba signature (float32; ``[T, D]`` inputs and outputs 2-D, ``[D]`` ones 1-D)."""
    dims = {"elem": "float32[:, :]", "col": "float32[:]"}
    args = [dims[n.kind] for n in graph.inputs] + [dims["elem"]] * len(graph.outputs)
    return f"void({', '.join(args)})"


MAX_SHARED_BYTES = 48 * 1024  # static shared memory per block without opting in to more


@dataclass
class FusedKernel:
    """A compiled one-kernel rendering of a graph for rows of ``d`` columns."""

    graph: Graph
    d: int
    threads: int
    source: str
    kernel: Any

    def __call__(self, out: Mapping[str, Any] | None = None, **arrays: Any) -> dict[str, Any]:
        """Run on device arrays (NumPy arrays under the simulator); returns the outputs.

        ``out`` maps output names to ``[T, D]`` float32 arrays to write; by default they are
        new arrays filled with NaN, so that an element the kernel fails to write shows up.
        """
        from ..kernels.gpu.arrays import launch, limits, xp

        if all(isinstance(a, np.ndarray) for a in arrays.values()):
            check_inputs(self.graph, arrays)
        t, d = arrays[graph_rows(self.graph)].shape
        if d != self.d:
            raise ValueError(f"this kernel was generated for rows of {self.d} columns, not {d}")
        names = [name for name, _ in self.graph.outputs]
        if out is None:
            outs = {name: xp().full((t, d), np.nan, dtype=np.float32) for name in names}
        elif sorted(out) != sorted(names) or any(tuple(a.shape) != (t, d) for a in out.values()):
            raise ValueError(f"out must map {names} to [{t}, {d}] arrays")
        else:
            outs = {name: out[name] for name in names}
        blocks = max(1, min(t, limits()[1]))
        launch(
            self.kernel, blocks, self.threads, *[arrays[n.name] for n in self.graph.inputs], *outs.values()
        )
        return outs


def numba_function(graph: Graph, d: int, threads: int, cuda: Any) -> Callable[..., None]:
    """:func:`numba_source` executed into a Python function (before ``cuda.jit``), with
    ``cuda`` (the ``numba.cuda`` module) as its global: what ``compile_ptx`` takes."""
    import math

    p = passes(graph)
    shared = (threads + len(p.staged) * d) * 4 if p.reduction is not None else 0
    if shared > MAX_SHARED_BYTES:
        raise ValueError(
            f"rows of {d} columns need {shared} bytes of shared memory; at most {MAX_SHARED_BYTES}"
        )
    namespace: dict[str, Any] = {"cuda": cuda, "math": math, "float32": np.float32}
    exec(
        compile(numba_source(graph, d, threads), f"<fused kernel of {len(graph.ops)} ops>", "exec"), namespace
    )
    return namespace["fused"]


def build_numba_kernel(graph: Graph, d: int, threads: int | None = None) -> FusedKernel:
    """Compile :func:`numba_source` with ``numba.cuda.jit`` (on a GPU, or in the simulator)."""
    from ..kernels.gpu import runtime
    from ..kernels.gpu.arrays import limits, pow2_at_least

    threads = threads or pow2_at_least(d, limits()[0])
    cuda = runtime.require_cuda("the fused kernel")
    function = numba_function(graph, d, threads, cuda)
    return FusedKernel(graph, d, threads, numba_source(graph, d, threads), cuda.jit(function))


# -- CuPy ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CupySource:
    """The arguments of one ``cupy.ElementwiseKernel`` or ``cupy.ReductionKernel``."""

    kind: str  # "elementwise" or "reduction"
    name: str
    in_params: str
    out_params: str
    operation: str = ""  # elementwise
    map_expr: str = ""  # reduction
    reduce_expr: str = ""
    post_map_expr: str = ""
    identity: str = ""
    io: KernelIO | None = None

    def build(self, cupy: Any) -> Any:
        """The CuPy kernel object (compiles on first call, which needs a GPU); made once per source."""
        return _build(self, cupy)

    def _make(self, cupy: Any) -> Any:
        if self.kind == "elementwise":
            return cupy.ElementwiseKernel(self.in_params, self.out_params, self.operation, self.name)
        return cupy.ReductionKernel(
            self.in_params, self.out_params, self.map_expr, self.reduce_expr, self.post_map_expr,
            self.identity, self.name,
        )  # fmt: skip


@functools.lru_cache(maxsize=64)
def _build(source: CupySource, cupy: Any) -> Any:
    return source._make(cupy)


def _inline(graph: Graph, n: Node, names: Mapping[int, str]) -> str:
    """``n`` as one C expression over inputs (used where CuPy wants an expression, not statements)."""
    if n.id in names:
        return names[n.id]
    if n.op == "const":
        return f"{n.value!r}f"
    return C_OPS[n.op].format(*(_inline(graph, graph.nodes[a], names) for a in n.args))


def cupy_kernels(graph: Graph, name: str = "fused") -> list[CupySource]:
    """CuPy kernel source for ``graph``: a ReductionKernel for the row reduction (if any) and
    an ElementwiseKernel for every ``[T, D]`` output, the row value passed as a ``[T, 1]`` array."""
    p = passes(graph)
    inputs = {n.id: n.name for n in graph.inputs}
    kernels = []
    row_value: dict[int, str] = {}
    if p.reduction is not None:
        r = p.reduction
        arg = graph.nodes[r.args[0]]
        used = [n for n in graph.inputs if n.id in ancestors(graph, [arg.id])]
        post = "out0 = a / (float)(_in_ind.size() / _out_ind.size())" if r.op == "mean" else "out0 = a"
        kernels.append(
            CupySource(
                "reduction",
                f"{name}_{r.op}",
                ", ".join(f"float32 {n.name}" for n in used),
                "float32 out0",
                map_expr=_inline(graph, arg, inputs),
                reduce_expr="a + b",
                post_map_expr=post,
                identity="0",
                io=KernelIO(f"{name}_{r.op}", tuple(n.kind for n in used), ("row",)),
            )  # fmt: skip
        )
        row_value = {r.id: "rowv"}
    names = {**inputs, **row_value}
    needed = ancestors(graph, [i for _, i in graph.outputs], stop=set(row_value))
    statements = []
    for n in graph.nodes:
        if n.op in ("input", "const") or n.id in row_value or n.id not in needed:
            continue
        statements.append(
            f"float v{n.id} = {C_OPS[n.op].format(*(_c_ref(graph, a, names) for a in n.args))};"
        )
        names[n.id] = f"v{n.id}"
    statements += [
        f"{out} = v{i};" if i not in inputs else f"{out} = {inputs[i]};" for out, i in graph.outputs
    ]
    used = [n for n in graph.inputs if n.id in needed]
    in_params = [f"float32 {n.name}" for n in used] + (["float32 rowv"] if row_value else [])
    kernels.append(
        CupySource(
            "elementwise",
            name,
            ", ".join(in_params),
            ", ".join(f"float32 {out}" for out, _ in graph.outputs),
            operation="\n".join(statements),
            io=KernelIO(
                name,
                tuple(n.kind for n in used) + (("row",) if row_value else ()),
                tuple("elem" for _ in graph.outputs),
            ),
        )  # fmt: skip
    )
    return kernels


def _c_ref(graph: Graph, node_id: int, names: Mapping[int, str]) -> str:
    n = graph.nodes[node_id]
    return f"{n.value!r}f" if n.op == "const" else names[node_id]


def ancestors(graph: Graph, ids: list[int], stop: set[int] = frozenset()) -> set[int]:
    """``ids`` and every node they are computed from, not looking past the nodes in ``stop``."""
    seen: set[int] = set()
    todo = list(ids)
    while todo:
        i = todo.pop()
        if i not in seen:
            seen.add(i)
            if i not in stop:
                todo += graph.nodes[i].args
    return seen


def cupy_plan(graph: Graph) -> list[KernelIO]:
    """What the CuPy kernels of :func:`cupy_kernels` launch, read and write."""
    return [k.io for k in cupy_kernels(graph) if k.io is not None]


def run_cupy(graph: Graph, cupy: Any, **arrays: Any) -> dict[str, Any]:
    """Run the CuPy kernels on CuPy arrays (needs a GPU): for ``scripts/gpu_check.py``."""
    kernels = cupy_kernels(graph)
    extra = []
    if kernels[0].kind == "reduction":
        red = kernels[0]
        names = [p.split()[1] for p in red.in_params.split(", ")]
        extra = [red.build(cupy)(*(arrays[n] for n in names), axis=-1)[:, None]]
    ew = kernels[-1]
    names = [p.split()[1] for p in ew.in_params.split(", ") if p != "float32 rowv"]
    outs = ew.build(cupy)(*(arrays[n] for n in names), *extra)
    outs = outs if isinstance(outs, tuple) else (outs,)
    return {name: o for (name, _), o in zip(graph.outputs, outs, strict=True)}


# -- NumPy ---------------------------------------------------------------------------------------


def numpy_source(graph: Graph, name: str = "fused") -> str:
    """The fused statements as one vectorised NumPy function of the graph's inputs."""

    def ref(n: Node) -> str:
        return f"np.float32({n.value!r})" if n.op == "const" else f"v{n.id}"

    lines = [f"def {name}({', '.join(n.name for n in graph.inputs)}):"]
    for n in graph.nodes:
        if n.op == "input":
            lines.append(f"    v{n.id} = {n.name}")
        elif n.op == "sum":
            lines.append(f"    v{n.id} = v{n.args[0]}.sum(axis=-1, keepdims=True, dtype=np.float32)")
        elif n.op == "mean":
            lines.append(f"    v{n.id} = v{n.args[0]}.mean(axis=-1, keepdims=True, dtype=np.float32)")
        elif n.op != "const":
            lines.append(f"    v{n.id} = np.float32({_expr(graph, n, NP_OPS, ref)})")
    lines.append("    return {" + ", ".join(f"{out!r}: v{i}" for out, i in graph.outputs) + "}")
    return "\n".join(lines) + "\n"


def numpy_fused(graph: Graph) -> Callable[..., dict[str, np.ndarray]]:
    """:func:`numpy_source` compiled: ``f(**inputs) -> {output: array}``."""
    namespace: dict[str, Any] = {"np": np}
    exec(compile(numpy_source(graph), "<fused numpy>", "exec"), namespace)
    return namespace["fused"]


__all__ = [
    "CupySource",
    "FusedKernel",
    "Passes",
    "build_numba_kernel",
    "cupy_kernels",
    "cupy_plan",
    "numba_function",
    "numba_signature",
    "numba_source",
    "numpy_fused",
    "numpy_source",
    "passes",
    "run_cupy",
]
