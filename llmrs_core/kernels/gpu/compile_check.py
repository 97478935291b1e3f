"""Compile every GPU kernel for a real target with ``numba.cuda.compile_ptx`` (chapter 9).

``python -m llmrs_core.kernels.gpu.compile_check [--cc 9.0]`` needs no GPU, but it needs
the real CUDA target, so it refuses to run under the simulator: the simulator runs kernels
as Python and never types them, so a kernel can pass every simulator test and still not
compile. Prints one line per kernel; exits 1 with the typing error of each that fails.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from . import runtime

MODULES = ("matvec", "matvec_int8", "elementwise", "attention", "sampling")


def kernels() -> list[tuple[str, object, list[str]]]:
    """``(module.name, Python function, signatures)`` of every kernel of :data:`MODULES`."""
    import importlib

    found = []
    for name in MODULES:
        module = importlib.import_module(f"{__package__}.{name}")
        found += [(f"{name}.{k}", f, sigs) for k, f, sigs in module.KERNELS]
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cc", default="9.0", help="compute capability to compile for (default 9.0, the H100/H200)")
    args = parser.parse_args(argv)
    if runtime.simulator_enabled():
        print(f"compile_check needs the real CUDA target: unset {runtime.SIMULATOR_ENV}", file=sys.stderr)
        return 2
    cc = tuple(int(p) for p in args.cc.split("."))
    # numba-cuda asks NVRTC which architectures the toolkit supports; NVRTC is not needed to
    # compile (NVVM does that), and CI machines often lack it: name the target instead.
    os.environ["NUMBA_FORCE_CUDA_CC"] = args.cc
    cuda = runtime.cuda()
    failed = 0
    for name, func, sigs in kernels():
        for sig in sigs:
            start = time.perf_counter()
            try:
                cuda.compile_ptx(func, sig, cc=cc)
            except Exception as e:  # the typing error is the message
                failed += 1
                print(f"FAIL {name} {sig}\n{type(e).__name__}: {e}\n")
            else:
                print(f"ok   {name} ({time.perf_counter() - start:.1f} s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
