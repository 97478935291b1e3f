"""A small torch.compile-style fusion pass: trace a chain of elementwise ops, count what fusing saves (chapter 9, §9.6).

In eager mode every operation is a kernel launch that reads its inputs from device memory
and writes its result back, so ``y = rms_norm(x + residual) * weight`` is seven launches
whose intermediates all make a round trip through DRAM. A compiler that sees the whole chain
can emit one kernel that reads ``x``, ``residual`` and ``weight`` once and writes only what
is used later. This module is the front half of such a compiler:

- :func:`trace` runs a Python function on :class:`Traced` stand-ins and records a
  :class:`Graph` of :class:`Node`\\ s (the ops are PyTorch's eager ops: ``+``, ``*``,
  ``square``, ``mean``, ``rsqrt``, ``silu``...);
- every value has a *kind* that says its shape on a ``[T, D]`` problem: ``"elem"``
  (``[T, D]``), ``"col"`` (``[D]``, a weight broadcast over rows), ``"row"`` (``[T]``, a
  per-row reduction broadcast over columns) or ``"scalar"`` (a constant baked into the code);
- :func:`eager_plan`, :func:`fused_plan` and the CuPy plan of
  :mod:`llmrs_core.labs.fusion_codegen` list the kernels each strategy launches with
  what each reads and writes, and :func:`traffic` turns a plan into launches and bytes;
- :func:`run_eager` executes the graph op by op in NumPy, counting the bytes of the arrays
  it actually reads and writes, the "before" that fused code is checked against.

The byte model: a kernel reads each of its input arrays from DRAM once and writes each
output once (what it keeps in registers or shared memory costs nothing); constants are
free. :mod:`llmrs_core.labs.fusion_codegen` generates the fused code from a graph.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

KINDS = ("elem", "col", "row", "scalar")
BINARY = ("add", "sub", "mul", "div")
UNARY = ("neg", "square", "exp", "rsqrt", "silu")
REDUCE = ("sum", "mean")  # over the last axis (columns), keeping one value per row


@dataclass(frozen=True)
class Node:
    """One value of the graph: an input, a constant, or one eager op applied to earlier nodes."""

    id: int
    op: str  # "input", "const", one of BINARY, UNARY or REDUCE
    args: tuple[int, ...]
    kind: str  # one of KINDS
    name: str | None = None  # inputs' names
    value: float | None = None  # constants' values


@dataclass(frozen=True)
class Graph:
    """Nodes in execution order, and the named outputs (ids of ``"elem"`` nodes)."""

    nodes: tuple[Node, ...]
    outputs: tuple[tuple[str, int], ...]

    @property
    def inputs(self) -> tuple[Node, ...]:
        return tuple(n for n in self.nodes if n.op == "input")

    @property
    def ops(self) -> tuple[Node, ...]:
        """The nodes that eager mode launches a kernel for."""
        return tuple(n for n in self.nodes if n.op not in ("input", "const"))

    def users(self, node_id: int) -> list[Node]:
        return [n for n in self.nodes if node_id in n.args]

    def describe(self) -> str:
        """One line per node: ``v3 = mul(v1, v2)   [elem]``."""
        lines = []
        for n in self.nodes:
            if n.op == "input":
                rhs = f"input {n.name!r}"
            elif n.op == "const":
                rhs = f"const {n.value!r}"
            else:
                rhs = f"{n.op}({', '.join(f'v{a}' for a in n.args)})"
            lines.append(f"v{n.id} = {rhs}".ljust(28) + f"[{n.kind}]")
        lines += [f"output {name!r} = v{i}" for name, i in self.outputs]
        return "\n".join(lines)


def _broadcast(a: str, b: str) -> str:
    kinds = {a, b} - {"scalar"}
    if not kinds:
        return "scalar"
    if len(kinds) == 1:
        return kinds.pop()
    return "elem"  # elem with anything, or col with row (an outer broadcast)


class Traced:
    """A value being traced: arithmetic on it appends nodes to its tracer's graph."""

    def __init__(self, tracer: _Tracer, node_id: int) -> None:
        self._tracer, self.id = tracer, node_id

    def _binary(self, op: str, other: Traced | float, reverse: bool = False) -> Traced:
        other_t = self._tracer.wrap(other)
        a, b = (other_t, self) if reverse else (self, other_t)
        return self._tracer.add(op, (a.id, b.id))

    def __add__(self, other):
        return self._binary("add", other)

    def __radd__(self, other):
        return self._binary("add", other, reverse=True)

    def __sub__(self, other):
        return self._binary("sub", other)

    def __rsub__(self, other):
        return self._binary("sub", other, reverse=True)

    def __mul__(self, other):
        return self._binary("mul", other)

    def __rmul__(self, other):
        return self._binary("mul", other, reverse=True)

    def __truediv__(self, other):
        return self._binary("div", other)

    def __rtruediv__(self, other):
        return self._binary("div", other, reverse=True)

    def __neg__(self):
        return self._tracer.add("neg", (self.id,))

    def square(self) -> Traced:
        return self._tracer.add("square", (self.id,))

    def exp(self) -> Traced:
        return self._tracer.add("exp", (self.id,))

    def rsqrt(self) -> Traced:
        return self._tracer.add("rsqrt", (self.id,))

    def silu(self) -> Traced:
        return self._tracer.add("silu", (self.id,))

    def sum(self) -> Traced:
        """Sum over the last axis: ``[T, D] -> [T]`` (broadcast back over columns when used)."""
        return self._tracer.add("sum", (self.id,))

    def mean(self) -> Traced:
        """Mean over the last axis: ``[T, D] -> [T]``."""
        return self._tracer.add("mean", (self.id,))


class _Tracer:
    def __init__(self) -> None:
        self.nodes: list[Node] = []

    def node(
        self, op: str, args: tuple[int, ...], kind: str, name: str | None = None, value: float | None = None
    ):
        self.nodes.append(Node(len(self.nodes), op, args, kind, name, value))
        return Traced(self, len(self.nodes) - 1)

    def wrap(self, value: Traced | float) -> Traced:
        if isinstance(value, Traced):
            if value._tracer is not self:
                raise ValueError("a traced value from another trace was mixed into this one")
            return value
        if isinstance(value, (bool, np.bool_)) or not isinstance(
            value, (int, float, np.floating, np.integer)
        ):
            raise TypeError(
                f"only traced values and Python numbers can be combined, not {type(value).__name__}"
            )
        if not np.isfinite(value):
            raise ValueError(f"constants must be finite numbers, not {value!r}")
        return self.node("const", (), "scalar", value=float(value))

    def add(self, op: str, args: tuple[int, ...]) -> Traced:
        kinds = [self.nodes[a].kind for a in args]
        if op in REDUCE:
            if kinds[0] != "elem":
                raise ValueError(f"{op} reduces the columns of a [T, D] value; v{args[0]} is {kinds[0]!r}")
            kind = "row"
        else:
            kind = kinds[0] if len(kinds) == 1 else _broadcast(*kinds)
        return self.node(op, args, kind)


# names the generated code uses itself (CuPy's, numba's, NumPy's and the kernels' own)
RESERVED = frozenset({"i", "n", "j", "a", "b", "row", "tid", "acc", "partial", "stage", "stride", "rowv", "out0",
                      "cuda", "math", "np", "float", "float32", "fused"})  # fmt: skip


def _check_name(name: str, what: str) -> None:
    if (
        not name.isidentifier()
        or name.startswith(("_", "out_"))
        or name in RESERVED
        or (name[0] == "v" and name[1:].isdigit())
    ):
        raise ValueError(
            f"{what} name {name!r} cannot be used in generated code: use an identifier that does not start "
            f"with '_' or 'out_', is not v<number>, and is none of {sorted(RESERVED)}"
        )


def trace(fn: Callable[..., Mapping[str, Traced]], **inputs: str) -> Graph:
    """The graph of ``fn`` called on traced inputs of the given kinds (``x="elem"``, ``weight="col"``).

    ``fn`` returns a dict ``{output name: traced value}``; outputs must be ``"elem"`` values.
    """
    tracer = _Tracer()
    args = {}
    for name, kind in inputs.items():
        _check_name(name, "input")
        if kind not in ("elem", "col"):
            raise ValueError(f"input {name!r}: kind must be 'elem' ([T, D]) or 'col' ([D]), not {kind!r}")
        args[name] = tracer.node("input", (), kind, name=name)
    result = fn(**args)
    if not isinstance(result, Mapping) or not result:
        raise TypeError(
            f"the traced function must return a dict of named outputs, not {type(result).__name__}"
        )
    outputs = []
    for name, value in result.items():
        _check_name(name, "output")
        if name in inputs:
            raise ValueError(f"output {name!r} has the name of an input")
        node = tracer.nodes[tracer.wrap(value).id]
        if node.kind != "elem":
            raise ValueError(f"output {name!r} is a {node.kind!r} value; outputs must be [T, D] ('elem')")
        outputs.append((name, node.id))
    graph = Graph(tuple(tracer.nodes), tuple(outputs))
    reductions = [n for n in graph.nodes if n.op in REDUCE]
    if len(reductions) > 1:
        raise NotImplementedError("this pass fuses chains with at most one row reduction (RMSNorm has one)")
    return graph


# -- the two blocks of §9.6 -------------------------------------------------------------------


def residual_rms_norm(x: Traced, residual: Traced, weight: Traced, eps: float = 1e-5) -> dict[str, Traced]:
    """A Llama block's seam: ``h = x + residual`` (the new residual stream) and ``rms_norm(h) * weight``.

    Written op for op as Hugging Face's ``LlamaRMSNorm`` runs in eager mode.
    """
    h = x + residual
    variance = h.square().mean()
    return {"h": h, "y": h * (variance + eps).rsqrt() * weight}


def swiglu(gate: Traced, up: Traced) -> dict[str, Traced]:
    """The gated activation of Llama's MLP: ``silu(gate) * up``."""
    return {"out": gate.silu() * up}


# -- plans and their traffic -----------------------------------------------------------------


@dataclass(frozen=True)
class KernelIO:
    """One kernel launch: the kinds of the arrays it reads and of those it writes."""

    name: str
    reads: tuple[str, ...]
    writes: tuple[str, ...]


@dataclass(frozen=True)
class Traffic:
    """Kernel launches and DRAM bytes of a plan on a ``[T, D]`` problem."""

    launches: int
    bytes_read: int
    bytes_written: int

    @property
    def bytes_moved(self) -> int:
        return self.bytes_read + self.bytes_written


def elements(kind: str, t: int, d: int) -> int:
    """How many values an array of ``kind`` holds on a ``[T, D]`` problem."""
    return {"elem": t * d, "col": d, "row": t, "scalar": 0}[kind]


def traffic(plan: list[KernelIO], t: int, d: int, itemsize: int = 4) -> Traffic:
    """Launches and bytes of ``plan`` (float32 by default)."""
    read = sum(elements(k, t, d) for kernel in plan for k in kernel.reads) * itemsize
    written = sum(elements(k, t, d) for kernel in plan for k in kernel.writes) * itemsize
    return Traffic(len(plan), read, written)


def eager_plan(graph: Graph) -> list[KernelIO]:
    """One kernel per op, reading its (non-constant) arguments and writing its result."""
    nodes = graph.nodes
    return [
        KernelIO(n.op, tuple(nodes[a].kind for a in n.args if nodes[a].kind != "scalar"), (n.kind,))
        for n in graph.ops
    ]


def fused_plan(graph: Graph) -> list[KernelIO]:
    """One kernel for the whole graph: reads every input once, writes every output once."""
    return [
        KernelIO(
            "fused",
            tuple(n.kind for n in graph.inputs),
            tuple(graph.nodes[i].kind for _, i in graph.outputs),
        )
    ]


# -- eager execution in NumPy ----------------------------------------------------------------

NUMPY_OPS: dict[str, Callable[..., np.ndarray]] = {
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "div": np.divide,
    "neg": np.negative,
    "square": np.square,
    "exp": np.exp,
    "rsqrt": lambda a: np.float32(1) / np.sqrt(a),
    "silu": lambda a: a * (np.float32(0.5) + np.float32(0.5) * np.tanh(np.float32(0.5) * a)),
    "sum": lambda a: a.sum(axis=-1, keepdims=True, dtype=np.float32),
    "mean": lambda a: a.mean(axis=-1, keepdims=True, dtype=np.float32),
}


def check_inputs(graph: Graph, arrays: Mapping[str, np.ndarray]) -> tuple[int, int]:
    """``(T, D)`` of the inputs, after checking names, kinds, shapes and dtype (float32)."""
    names = {n.name for n in graph.inputs}
    if set(arrays) != names:
        raise ValueError(f"the graph's inputs are {sorted(names)}, got {sorted(arrays)}")
    elem = [n.name for n in graph.inputs if n.kind == "elem"]
    if not elem:
        raise ValueError("the graph needs at least one [T, D] input")
    t, d = np.shape(arrays[elem[0]]) if np.ndim(arrays[elem[0]]) == 2 else (None, None)
    for n in graph.inputs:
        a = arrays[n.name]
        want = (t, d) if n.kind == "elem" else (d,)
        if t is None or a.shape != want or a.dtype != np.float32:
            raise ValueError(
                f"input {n.name!r} ({n.kind}) must be float32 of shape {want}, not {a.dtype} {a.shape}"
            )
    return t, d


def run_eager(graph: Graph, arrays: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], Traffic]:
    """The graph op by op in NumPy (float32), each op a "launch"; and the bytes its arrays held.

    Row values are kept as ``[T, 1]`` and column values as ``[D]`` so NumPy broadcasts them.
    """
    check_inputs(graph, arrays)
    values: dict[int, np.ndarray | np.float32] = {}
    launches = read = written = 0
    for n in graph.nodes:
        if n.op == "input":
            values[n.id] = arrays[n.name]
        elif n.op == "const":
            values[n.id] = np.float32(n.value)
        else:
            args = [values[a] for a in n.args]
            out = np.asarray(NUMPY_OPS[n.op](*args), dtype=np.float32)
            launches += 1
            read += sum(a.nbytes for a in args if isinstance(a, np.ndarray))
            written += out.nbytes
            values[n.id] = out
    return {name: values[i] for name, i in graph.outputs}, Traffic(launches, read, written)


__all__ = [
    "KINDS",
    "Graph",
    "KernelIO",
    "Node",
    "Traced",
    "Traffic",
    "check_inputs",
    "eager_plan",
    "elements",
    "fused_plan",
    "residual_rms_norm",
    "run_eager",
    "swiglu",
    "trace",
    "traffic",
]
