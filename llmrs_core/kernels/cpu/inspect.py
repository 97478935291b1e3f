"""What LLVM emitted: the instruction mix of a compiled Numba kernel (chapter 8, section 8.1).

"Did it vectorise?" is answered by the assembly, not by hope. Numba shows
the assembly of a function it compiled (``dispatcher.inspect_asm()``), but
not of one it loaded from its on-disk cache, so :func:`assembly` compiles a
fresh, uncached copy. ``parallel=False`` by default: the loop body is the
same, and a serial function's assembly is not buried in thread-pool code.
"""

from __future__ import annotations

import functools
import platform
import re
from collections import Counter

from numba import njit

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


# A probe of what LLVM emits for a target: one 8-wide float FMA and one 8-wide integer add.
# With FMA (and AVX) the first is a single vfmadd...ps on ymm registers; without, LLVM calls
# fmaf eight times or splits it. With AVX2 the second is one vpaddd on ymm; with AVX only, two
# on xmm. ``ptr`` arguments: LLVM 15+ IR (opaque pointers), what llvmlite >= 0.44 ships.
_PROBE_IR = r"""
define void @fma8(ptr %p, ptr %q, ptr %s) {
  %a = load <8 x float>, ptr %p
  %b = load <8 x float>, ptr %q
  %c = load <8 x float>, ptr %s
  %r = call <8 x float> @llvm.fma.v8f32(<8 x float> %a, <8 x float> %b, <8 x float> %c)
  store <8 x float> %r, ptr %p
  ret void
}
define void @add8(ptr %p, ptr %q) {
  %a = load <8 x i32>, ptr %p
  %b = load <8 x i32>, ptr %q
  %r = add <8 x i32> %a, %b
  store <8 x i32> %r, ptr %p
  ret void
}
declare <8 x float> @llvm.fma.v8f32(<8 x float>, <8 x float>, <8 x float>)
"""
_PROBES = {
    "fma": re.compile(r"^\s+vf(?:n?m(?:add|sub)|madd|msub)\w*ps\s[^\n]*%ymm", re.M),
    "avx2": re.compile(r"^\s+vpaddd\s[^\n]*%ymm", re.M),
}


def numba_target() -> tuple[str, str, str]:
    """The CPU Numba compiles for: ``(cpu name, feature string, description for messages)``.

    Resolved as Numba's JIT code generator does (``numba.core.codegen``): the CPU name is
    ``NUMBA_CPU_NAME`` (``numba.core.config.CPU_NAME``), else the host's; the features are
    ``NUMBA_CPU_FEATURES`` (``config.CPU_FEATURES``; Numba makes it ``""`` for ``generic``),
    else the host's as Numba reads them (``NUMBA_ENABLE_AVX=0`` removes AVX). ``host`` is the
    host's name: LLVM itself does not know it (Numba passes it on, with the host's features).
    """
    import llvmlite.binding as llvm
    from numba.core import config

    name = config.CPU_NAME
    features = config.CPU_FEATURES
    if features is None:
        try:
            from numba.core.codegen import get_host_cpu_features

            features = get_host_cpu_features()
        except ImportError:  # an older or newer Numba: llvmlite's view of the host
            features = llvm.get_host_cpu_features().flatten()
    if name is None or name == "host":
        cpu = llvm.get_host_cpu_name()
        where = f"this CPU ({cpu})" if name is None else f"NUMBA_CPU_NAME=host ({cpu})"
    else:
        cpu = name
        where = f"NUMBA_CPU_NAME={name}"
    if config.CPU_FEATURES is not None:
        where += f" with NUMBA_CPU_FEATURES={config.CPU_FEATURES!r}"
    return cpu, features, where


@functools.cache
def _target_has(cpu: str, features: str) -> dict[str, bool]:
    import llvmlite.binding as llvm

    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    # "+64bit": an x86-64 CPU has it; without it an explicit feature list on an unknown name
    # makes LLVM abort ("64-bit code requested on a subtarget that doesn't support it")
    flags = ",".join(f for f in ("+64bit", features) if f)
    try:
        machine = llvm.Target.from_default_triple().create_target_machine(cpu=cpu, features=flags, opt=2)
        module = llvm.parse_assembly(_PROBE_IR)
        module.verify()
        asm = machine.emit_assembly(module)
    except RuntimeError:  # an LLVM that cannot read the probe (typed pointers, before LLVM 15)
        # the feature string alone: right for the host and for explicit NUMBA_CPU_FEATURES,
        # blind to what a bare CPU name implies
        named = {f[1:]: f[0] == "+" for f in features.split(",") if f[:1] in "+-" and len(f) > 1}
        return {feature: named.get(feature, False) for feature in _PROBES}
    return {feature: bool(pattern.search(asm)) for feature, pattern in _PROBES.items()}


def target_lacks(*features: str) -> str | None:
    """Why Numba's target lacks ``features`` (from ``"avx2"``, ``"fma"``), or None if it has them all.

    The target is the one Numba compiles for (:func:`numba_target`), probed as
    :func:`packed_fma_unavailable` explains; a CPU that is not x86-64 lacks them all.
    """
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return f"this CPU is {platform.machine()}, not x86-64"
    cpu, flags, where = numba_target()
    has = _target_has(cpu, flags)
    missing = [f for f in features if not has[f]]
    return f"Numba compiles for {where}, which lacks {' and '.join(missing)}" if missing else None


def target_declares(*features: str) -> bool:
    """Whether the feature string Numba compiles with turns on every one of ``features`` (LLVM's
    names, e.g. ``"avx512vnni"``, ``"avx512vl"``).

    For features no probe can test: an instruction the target lacks does not compile to
    something slower, LLVM aborts the process on it. The host's string (Numba's default) and an
    explicit ``NUMBA_CPU_FEATURES`` list them; a bare ``NUMBA_CPU_NAME`` (``haswell``,
    ``znver4``) gives an empty string, so this says False there even for a CPU that has them,
    and the caller takes its fallback.
    """
    _, flags, _ = numba_target()
    on = {f[1:] for f in flags.split(",") if f.startswith("+")}
    return all(f in on for f in features)


def packed_fma_unavailable() -> str | None:
    """Why Numba's code cannot show packed FMAs here (the reason, for a skip), or None if it can.

    It asks the target Numba compiles for (:func:`numba_target`), not the host CPU:
    with ``NUMBA_CPU_NAME=generic`` there is no AVX2 even on a CPU that has it, and with
    ``haswell`` there is. The answer comes from LLVM itself: a tiny probe (an 8-wide float
    FMA, an 8-wide integer add) is compiled for that CPU name and feature string, and its
    assembly read for ``vfmadd...ps``/``vpaddd`` on ``ymm`` registers. That follows every way
    a target is named (a CPU name's own features, ``+fma``/``-avx2`` in a feature string,
    ``x86-64-v3``, a name newer than any table kept here) without a table of CPUs to go stale;
    llvmlite has no call that lists the features a CPU name implies. The probe takes a few
    milliseconds and is compiled once per target.
    """
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return f"the assembly check reads x86 instructions; this CPU is {platform.machine()}"
    cpu, features, where = numba_target()
    has = _target_has(cpu, features)
    missing = [f for f in ("avx2", "fma") if not has[f]]
    if missing:
        return f"Numba compiles for {where}, which lacks {' and '.join(missing)}: no 8-wide FMA instruction to look for"
    return None


__all__ = ["assembly", "instruction_mix", "numba_target", "packed_fma_unavailable", "target_declares", "target_lacks", "vector_summary"]
