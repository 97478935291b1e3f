"""What LLVM emitted: the instruction mix of a compiled Numba kernel (chapter 8, section 8.1).

"Did it vectorise?" is answered by the assembly, not by hope. Numba shows
the assembly of a function it compiled (``dispatcher.inspect_asm()``), but
not of one it loaded from its on-disk cache, so :func:`assembly` compiles a
fresh, uncached copy. ``parallel=False`` by default: the loop body is the
same, and a serial function's assembly is not buried in thread-pool code. Which target Numba
compiles for, and what it has, is :mod:`.target`'s (the int8 dispatch asks it too).
"""

from __future__ import annotations

import platform
import re
from collections import Counter

from numba import njit

from .target import target_lacks

_INSTRUCTION = re.compile(r"^\s+([a-z][a-z0-9]*)\s", re.M)
_REGISTER = re.compile(r"%([xyz]mm)\d+")
# float64 arithmetic and conversions into float64 (moves, shuffles and logic left out: they carry
# bits, whatever their suffix says); on a ymm/zmm register, code vectorised in doubles
_DOUBLE_ARITHMETIC = re.compile(r"v(?:add|sub|mul|div|fn?m(?:add|sub)\w*)pd$|vcvt\w+2pdx?$")


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
    ``vfmadd...ss``: one float at a time. ``packed_double`` counts float64
    arithmetic on ``ymm``/``zmm`` registers (``vaddpd``, ``vmulpd``,
    ``vfmadd...pd``, conversions into doubles such as ``vcvtps2pd``): code
    vectorised in doubles, half the lanes of float32, which a float32 kernel
    has none of. ``zmm``/``ymm``/``xmm`` count the instructions touching each
    register width.
    """
    out = {"packed_fma": 0, "scalar_fma": 0, "packed_double": 0, "zmm": 0, "ymm": 0, "xmm": 0}
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
        if _DOUBLE_ARITHMETIC.match(op) and widths & {"ymm", "zmm"}:
            out["packed_double"] += 1
        for w in widths:
            out[w] += 1
    return out


def packed_fma_unavailable() -> str | None:
    """Why Numba's code cannot show packed FMAs here (the reason, for a skip), or None if it can.

    It asks the target Numba compiles for (:func:`~.target.numba_target`), not the host CPU:
    with ``NUMBA_CPU_NAME=generic`` there is no AVX2 even on a CPU that has it, and with
    ``haswell`` there is. The answer comes from LLVM itself (:func:`~.target.target_lacks`): a
    tiny probe (an 8-wide float FMA, an 8-wide integer add) is compiled for that CPU name and
    feature string, and its assembly read for ``vfmadd...ps``/``vpaddd`` on ``ymm`` registers.
    That follows every way a target is named (a CPU name's own features, ``+fma``/``-avx2`` in a
    feature string, ``x86-64-v3``, a name newer than any table kept here) without a table of CPUs
    to go stale; llvmlite has no call that lists the features a CPU name implies. The probe takes
    a few milliseconds and is compiled once per target.
    """
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return f"the assembly check reads x86 instructions; this CPU is {platform.machine()}"
    missing = target_lacks("avx2", "fma")
    return f"{missing}: no 8-wide FMA instruction to look for" if missing else None


__all__ = ["assembly", "instruction_mix", "packed_fma_unavailable", "vector_summary"]
