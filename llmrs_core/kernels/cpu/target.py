"""The CPU Numba compiles for, and what it can run (chapter 8): the int8 dispatch's question.

:func:`numba_target` names the target as Numba's code generator resolves it (``NUMBA_CPU_NAME``,
``NUMBA_CPU_FEATURES``, else the host); :func:`target_lacks` asks LLVM itself, with a tiny
probe compiled for that target, whether it has AVX2 and FMA; :func:`target_declares` reads
the feature string for features no probe may test (an AVX-512 VNNI instruction the target
lacks aborts LLVM). ``kernels/cpu/int8.py`` picks its kernels with these; chapter 8's assembly
inspector (:mod:`.inspect`) skips its packed-FMA check with them.
"""

from __future__ import annotations

import functools
import platform
import re

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

    The target is the one Numba compiles for (:func:`numba_target`). LLVM answers: the probe
    above (an 8-wide float FMA, an 8-wide integer add) is compiled for that CPU name and feature
    string and its assembly read for ``vfmadd...ps``/``vpaddd`` on ``ymm`` registers, once per
    target. A CPU that is not x86-64 lacks them all.
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


__all__ = ["numba_target", "target_declares", "target_lacks"]
