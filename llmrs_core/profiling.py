"""Where a forward pass spends its time: a table of hotspots from cProfile (chapter 8, Exercise 8.8).

``profile_forward(model, ids)`` runs ``model.network.forward(ids)`` under
Python's deterministic profiler and returns the functions that took the most
**own time** (time in the function itself, not in the functions it called),
largest first, each with its share of the whole pass::

    >>> hotspots = profile_forward(llmrs.load(backend="numba"), [42])
    >>> print(format_hotspots(hotspots))

What cProfile can and cannot see:

* every call of a Python function, and of a C function called *as a
  function* (``np.concatenate(...)``), is counted and timed;
* a Numba-compiled kernel reports its calls to the profiler itself, so a
  kernel appears under its Python name (``kernels/cpu/matmul.py:q4_matvec``)
  and its own time is the kernel's running time;
* an operator is not a call: the BLAS work of ``x @ w.T`` is billed to the
  function whose line holds the ``@``;
* nothing *inside* a kernel: which loop, which instruction, cache misses.
  For that, and for a profile without cProfile's per-call overhead (a few
  hundred nanoseconds, which inflates functions called very often), use a
  sampling profiler: ``py-spy record --native`` or Linux ``perf``.
"""

from __future__ import annotations

import cProfile
import pstats
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

_PACKAGE_PARENT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Hotspot:
    """One function of a profile.

    ``name`` says where it lives: ``"path/to/file.py:function"`` for Python
    code (paths from the package or ``site-packages``), ``"<built-in>:..."``
    for C functions. ``calls`` counts calls (recursive ones included),
    ``seconds`` is the function's own time over those calls, ``share`` is
    ``seconds`` divided by the profile's total time.
    """

    name: str
    calls: int
    seconds: float
    share: float


def function_name(key: tuple[str, int, str]) -> str:
    """A readable name for a pstats key ``(filename, line, function)``.

    ``("/.../llmrs_core/kernels/cpu/matmul.py", 63, "q4_matvec")`` ->
    ``"llmrs_core/kernels/cpu/matmul.py:q4_matvec"``;
    ``("~", 0, "<method 'reduce' of 'numpy.ufunc' objects>")`` ->
    ``"<built-in>:<method 'reduce' of 'numpy.ufunc' objects>"``.
    """
    filename, _, function = key
    if filename == "~" or not filename:
        return f"<built-in>:{function}"
    path = Path(filename)
    parts = path.parts
    if "site-packages" in parts:
        where = "/".join(parts[len(parts) - parts[::-1].index("site-packages"):])
    else:
        try:
            where = path.resolve().relative_to(_PACKAGE_PARENT).as_posix()
        except ValueError:
            where = path.name
    return f"{where}:{function}"


def profile_forward(
    model, ids: Sequence[int], top: int = 10, warm_up: bool = True, repeat: int = 1
) -> list[Hotspot]:
    """The ``top`` functions by own time in ``repeat`` forward passes over ``ids`` (``[T]`` token ids).

    ``model`` is a loaded model (``llmrs.load()``) or its network. Each pass
    is ``network.forward(ids)``: the ids as a whole sequence from position 0
    (a single id gives a decode-sized step). ``warm_up`` runs one pass first,
    unprofiled, so that compilation and first-touch costs are not counted.
    Sorted by ``seconds``, largest first; ``share`` is ``seconds`` over the
    total own time of every function in the profile.
    """
    if repeat < 1 or top < 1:
        raise ValueError(f"top and repeat must be at least 1, got top={top}, repeat={repeat}")
    network = getattr(model, "network", model)
    ids = np.asarray(ids, dtype=np.int64).reshape(-1)
    if warm_up:
        network.forward(ids)
    profiler = cProfile.Profile()
    profiler.enable()
    try:
        for _ in range(repeat):
            network.forward(ids)
    finally:
        profiler.disable()
    stats = pstats.Stats(profiler)
    total = stats.total_tt
    rows = [
        Hotspot(function_name(key), int(calls), float(own), float(own) / total if total > 0 else 0.0)
        for key, (_, calls, own, _, _) in stats.stats.items()
        if own > 0 and not key[2].startswith("<method 'disable' of '_lsprof.Profiler'")
    ]
    rows.sort(key=lambda h: h.seconds, reverse=True)
    return rows[:top]


def format_hotspots(hotspots: Sequence[Hotspot], width: int = 60) -> str:
    """A text table of ``hotspots``: own time, share, calls, time per call, name."""
    lines = [f"{'own ms':>8} {'share':>6} {'calls':>6} {'µs/call':>8}  function"]
    for h in hotspots:
        name = h.name if len(h.name) <= width else "…" + h.name[-(width - 1):]
        lines.append(
            f"{h.seconds * 1e3:8.2f} {h.share:6.1%} {h.calls:6d} {h.seconds / max(h.calls, 1) * 1e6:8.1f}  {name}"
        )
    return "\n".join(lines)


__all__ = ["Hotspot", "format_hotspots", "function_name", "profile_forward"]
