"""What a benchmark result was measured on (appendix A.1, A.2): the machine, the software, the run.

A tokens/s figure without its environment cannot be compared with anything: the
same code is 2× apart on two CPUs, and BLAS, Numba's threading layer or a thread
count change it as much. :func:`environment` records what the book's appendix A
asks for:

* **machine** (:func:`machine`): CPU model and the SIMD flags our kernels and
  llama.cpp's care about (AVX2, FMA, AVX-512, VNNI, AMX), logical cores, cache
  sizes, memory — read from ``/proc`` and ``/sys`` on Linux, ``None`` where a
  system does not say;
* **measured** (:func:`measure_machine`): memory bandwidth from a STREAM triad
  (``a = b + s·c`` over arrays far larger than the caches) and float32 GEMM
  throughput through NumPy's BLAS — the two roofs of the roofline (A.5);
* **software**: OS, Python, the versions of every package that computes,
  Numba's threading layer and the BLAS libraries loaded (threadpoolctl);
* **run**: thread counts and the environment variables that set them, the git
  commit and whether the tree was dirty, the time (UTC).
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

#: CPU flags (as /proc/cpuinfo spells them) that decide which kernels run fast
FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx_vnni",
         "avx512_bf16", "amx_tile", "amx_int8", "amx_bf16")
#: the packages whose versions change results
PACKAGES = ("numpy", "numba", "llvmlite", "scipy", "tokenizers", "threadpoolctl", "tbb", "llama_cpp_python",
            "fastapi", "uvicorn", "openai", "mpi4py", "cupy-cuda12x", "cupy-cuda13x", "numba-cuda", "torch",
            "transformers")
#: environment variables that set thread counts or kernels
THREAD_VARIABLES = ("NUMBA_NUM_THREADS", "NUMBA_THREADING_LAYER", "NUMBA_CPU_NAME", "OPENBLAS_NUM_THREADS",
                    "OPENBLAS_CORETYPE", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text()
    except OSError:
        return None


def cpu_model_and_flags(cpuinfo: str | None = None) -> tuple[str, dict[str, bool]]:
    """``(model name, {flag: present})`` from ``/proc/cpuinfo`` (or the text given); elsewhere
    the platform's processor name and no flags known."""
    text = _read("/proc/cpuinfo") if cpuinfo is None else cpuinfo
    model = platform.processor() or platform.machine()
    flags: set[str] = set()
    for line in (text or "").splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and value.strip():
            model = value.strip()
        elif key in ("flags", "Features") and not flags:
            flags = set(value.split())
    return model, ({f: f in flags for f in FLAGS} if flags else {})


def caches() -> dict[str, str]:
    """Cache sizes of CPU 0 by level and type (``{"L1d": "32K", "L2": "512K", ...}``), from sysfs."""
    out = {}
    root = Path("/sys/devices/system/cpu/cpu0/cache")
    for index in sorted(root.glob("index*")) if root.is_dir() else ():
        level, kind, size = (_read(str(index / name)) for name in ("level", "type", "size"))
        if level and kind and size:
            suffix = {"Data": "d", "Instruction": "i"}.get(kind.strip(), "")
            out[f"L{level.strip()}{suffix}"] = size.strip()
    return out


def memory_bytes() -> int | None:
    """Physical memory in bytes (``/proc/meminfo``'s MemTotal), or None."""
    for line in (_read("/proc/meminfo") or "").splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    return None


def machine() -> dict:
    """CPU model, SIMD flags, logical cores, caches and memory of this machine."""
    model, flags = cpu_model_and_flags()
    return {"cpu": model, "arch": platform.machine(), "cores": os.cpu_count(), "flags": flags,
            "caches": caches(), "memory_bytes": memory_bytes()}


def stream_triad_gb_s(n: int = 1 << 24, repetitions: int = 5) -> float:
    """Memory bandwidth (GB/s) of the STREAM triad ``a = b + s * c`` on float64 arrays of ``n``
    (3 × 128 MiB by default: far past any cache): the best of ``repetitions``, counting 24 bytes
    moved per element as STREAM does. NumPy does it in two passes (``np.multiply`` into ``a``,
    then ``np.add``), so it moves 40 bytes an element: we time those and report STREAM's 24 over
    the time, which is what a one-pass triad would need — a lower bound on the bandwidth."""
    b = np.ones(n)
    c = np.full(n, 2.0)
    a = np.empty(n)
    best = float("inf")
    for _ in range(repetitions + 1):  # the first run pages the arrays in
        start = time.perf_counter()
        np.multiply(c, 3.0, out=a)
        np.add(a, b, out=a)
        best = min(best, time.perf_counter() - start)
    return 24 * n / best / 1e9


def gemm_gflop_s(n: int = 1024, repetitions: int = 5) -> float:
    """float32 matrix-multiply throughput (GFLOP/s, 2·n³ per product) through NumPy's BLAS: the best
    of ``repetitions``; the compute roof of the roofline at this BLAS's thread count."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, n), dtype=np.float32)
    y = rng.standard_normal((n, n), dtype=np.float32)
    best = float("inf")
    for _ in range(repetitions + 1):
        start = time.perf_counter()
        x @ y
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best / 1e9


def measure_machine(quick: bool = False) -> dict:
    """``{"stream_triad_gb_s", "gemm_f32_gflop_s"}`` measured now (``quick``: smaller arrays)."""
    return {"stream_triad_gb_s": stream_triad_gb_s(1 << (22 if quick else 24)),
            "gemm_f32_gflop_s": gemm_gflop_s(512 if quick else 1024)}


def packages() -> dict[str, str]:
    """Versions of the installed :data:`PACKAGES` (those not installed are left out)."""
    out = {}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    return out


def blas_libraries() -> list[dict]:
    """The BLAS (and OpenMP) libraries loaded in this process, as threadpoolctl sees them."""
    from threadpoolctl import threadpool_info

    keep = ("user_api", "internal_api", "version", "num_threads", "threading_layer", "architecture")
    return [{k: lib.get(k) for k in keep} for lib in threadpool_info()]


def git_state(root: Path | None = None) -> dict:
    """``{"commit", "dirty"}`` of the checkout at ``root`` (the package's), or Nones outside git."""
    root = root or Path(__file__).resolve().parents[2]
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                                timeout=10, check=True).stdout.strip()
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                                capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}
    return {"commit": commit, "dirty": bool(status.strip())}


def environment(threads: int, measure: bool = True, quick: bool = False) -> dict:
    """Everything :mod:`this module <llmrs_core.bench.environment>` records, for one result file."""
    from ..kernels.cpu.threads import threading_layer

    return {
        "machine": machine(),
        "measured": measure_machine(quick) if measure else None,
        "os": platform.platform(),
        "python": sys.version.split()[0],
        "packages": packages(),
        "numba_threading_layer": threading_layer(),
        "blas": blas_libraries(),
        "threads": threads,
        "thread_variables": {k: os.environ[k] for k in THREAD_VARIABLES if k in os.environ},
        "git": git_state(),
        "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def describe(env: dict) -> str:
    """One line for a report: CPU, flags present, cores, the measured roofs."""
    m = env["machine"]
    flags = [f for f, on in m.get("flags", {}).items() if on and f in ("avx2", "fma", "avx512f", "avx512_vnni",
                                                                         "avx_vnni", "amx_int8")]
    line = f"{m['cpu']} ({', '.join(flags) or 'no AVX2'}), {m['cores']} logical cores"
    if env.get("measured"):
        line += (f"; STREAM triad {env['measured']['stream_triad_gb_s']:.1f} GB/s, "
                 f"GEMM f32 {env['measured']['gemm_f32_gflop_s']:.0f} GFLOP/s")
    return line


__all__ = ["FLAGS", "PACKAGES", "blas_libraries", "caches", "cpu_model_and_flags", "describe", "environment",
           "gemm_gflop_s", "git_state", "machine", "measure_machine", "memory_bytes", "packages",
           "stream_triad_gb_s"]
