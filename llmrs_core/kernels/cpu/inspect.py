"""What LLVM emitted: the instruction mix of a compiled Numba kernel (chapter 8, section 8.1).

"Did it vectorise?" is answered by the assembly, not by hope. Numba shows
the assembly of a function it compiled (``dispatcher.inspect_asm()``), but
not of one it loaded from its on-disk cache, so :func:`assembly` compiles a
fresh, uncached copy. ``parallel=False`` by default: the loop body is the
same, and a serial function's assembly is not buried in thread-pool code.
"""

from __future__ import annotations

import platform
import re
from collections import Counter

from numba import njit

_INSTRUCTION = re.compile(r"^\s+([a-z][a-z0-9]*)\s", re.M)
_REGISTER = re.compile(r"%([xyz]mm)\d+")


def assembly(kernel, *args, parallel: bool = False, fastmath: bool = True) -> str:
    """x86 assembly of ``kernel`` (a Numba dispatcher or a plain function) compiled for ``args``."""
    fn = getattr(kernel, "py_func", kernel)
    fresh = njit(fastmath=fastmath, parallel=parallel, cache=False)(fn)
    fresh(*args)
    return "\n".join(fresh.inspect_asm().values())


def instruction_mix(asm: str) -> Counter:
    """How often each instruction mnemonic appears in ``asm`` (static count, not executions)."""
    return Counter(_INSTRUCTION.findall(asm))


def vector_summary(asm: str) -> dict[str, int]:
    """Counts that tell vector code from scalar code.

    ``packed_fma`` is ``vfmadd...ps`` on ``ymm`` (8 floats) or ``zmm`` (16
    floats) registers: a vectorised multiply-add. ``scalar_fma`` is
    ``vfmadd...ss``: one float at a time. ``zmm``/``ymm``/``xmm`` count the
    instructions touching each register width.
    """
    out = {"packed_fma": 0, "scalar_fma": 0, "zmm": 0, "ymm": 0, "xmm": 0}
    for line in asm.splitlines():
        m = _INSTRUCTION.match(line)
        if not m:
            continue
        op = m.group(1)
        widths = set(_REGISTER.findall(line))
        if op.startswith("vfmadd") or op.startswith("vfmsub") or op.startswith("vfnmadd"):
            if op.endswith("ps") and widths & {"ymm", "zmm"}:
                out["packed_fma"] += 1
            elif op.endswith("ss"):
                out["scalar_fma"] += 1
        for w in widths:
            out[w] += 1
    return out


def packed_fma_unavailable() -> str | None:
    """Why this CPU's assembly cannot show packed FMAs (the reason, for a skip), or None if it can."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return f"the assembly check reads x86 instructions; this CPU is {platform.machine()}"
    import llvmlite.binding as llvm

    features = llvm.get_host_cpu_features()
    missing = [f for f in ("avx2", "fma") if not features.get(f, False)]
    if missing:
        return f"this CPU lacks {', '.join(missing)}: no 8-wide FMA instruction to look for"
    return None


__all__ = ["assembly", "instruction_mix", "packed_fma_unavailable", "vector_summary"]
