"""``make check-env``: is this machine ready for the workbook?

Prints one ``[OK]`` / ``[FAIL]`` line for Python, each dependency named in
pyproject.toml (the engine's, the notebooks' and the tests'), the model file,
and whether a GPU is usable. Runs with the standard library alone, so it can
explain a broken environment instead of crashing in it. Exit status 1 if
anything required fails; no GPU is fine.

Run it as ``python llmrs_core/check_env.py`` (that is what the Makefile does).
"""

from __future__ import annotations

import importlib.metadata as metadata
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MIN_PYTHON = (3, 10)


def _load_fetch_module():
    """llmrs_core/fetch.py uses only the standard library; load it without the package
    (whose __init__ imports NumPy, which may be the thing that is missing)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("_llmrs_fetch", Path(__file__).with_name("fetch.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def _version_tuple(v: str) -> tuple[int, ...]:
    parts = []
    for piece in v.split("."):
        m = re.match(r"\d+", piece)
        if not m:
            break
        parts.append(int(m.group()))
    return tuple(parts)


def _marker_applies(marker: str) -> bool:
    """Evaluate the only environment marker we use: ``python_version <op> 'X.Y'``."""
    m = re.search(r"python_version\s*(<=|>=|<|>|==)\s*['\"]([\d.]+)['\"]", marker)
    if not m:
        return True
    have, want = sys.version_info[:2], _version_tuple(m.group(2))
    return {"<": have < want, "<=": have <= want, ">": have > want, ">=": have >= want,
            "==": have == want}[m.group(1)]


def requirements(groups: tuple[str, ...] = ("lab", "dev")) -> list[tuple[str, str]]:
    """``(distribution, lower bound)`` pairs from pyproject.toml's dependencies and extras."""
    text = (ROOT / "pyproject.toml").read_text()
    try:
        import tomllib
    except ImportError:  # Python 3.10
        try:
            import tomli as tomllib  # type: ignore[no-redef]
        except ImportError:
            tomllib = None  # type: ignore[assignment]
    if tomllib is not None:
        project = tomllib.loads(text)["project"]
        specs = list(project["dependencies"])
        for g in groups:
            specs += project.get("optional-dependencies", {}).get(g, [])
    else:  # a rough parse is enough to report on
        specs = re.findall(r'^\s*"([A-Za-z0-9_.\-]+(?:>=[^"]+)?)",?\s*$', text, re.M)
    out = []
    for spec in specs:
        spec, _, marker = spec.partition(";")
        if not _marker_applies(marker):
            continue
        name, _, bound = spec.partition(">=")
        name = name.strip()
        if name.startswith("llmrs-core"):
            continue  # the extra that pulls in another extra
        out.append((name, bound.split(",")[0].strip()))
    return out


def check_python() -> tuple[bool, str]:
    v = sys.version_info
    ok = (v.major, v.minor) >= MIN_PYTHON
    need = ".".join(map(str, MIN_PYTHON))
    return ok, f"Python {v.major}.{v.minor}.{v.micro} at {sys.executable} (need >= {need})"


def check_distribution(name: str, bound: str) -> tuple[bool, str]:
    try:
        have = metadata.version(name)
    except metadata.PackageNotFoundError:
        return False, f"{name}: not installed (run `make setup`)"
    if bound and _version_tuple(have) < _version_tuple(bound):
        return False, f"{name} {have}: need >= {bound} (run `make setup`)"
    return True, f"{name} {have}" + (f" (>= {bound})" if bound else "")


def check_model() -> tuple[bool, str]:
    fetch = _load_fetch_module()
    path, expected = fetch.default_model_path(), fetch.DEFAULT_MODEL.size
    if not path.exists():
        return False, f"model: {path} is missing (run `make fetch`)"
    size = path.stat().st_size
    if size != expected:
        return False, f"model: {path} has {size:,} bytes, expected {expected:,} (run `llmrs fetch --force`)"
    return True, f"model: {path} ({size:,} bytes)"


def check_gpu() -> str:
    """A line on GPU support; never a failure, since every chapter runs without one."""
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
                capture_output=True, text=True, timeout=10,
            ).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            out = ""
        gpu = out.splitlines()[0] if out else "an NVIDIA driver, but nvidia-smi lists no GPU"
    else:
        gpu = None
    try:
        import cupy  # noqa: F401

        n = cupy.cuda.runtime.getDeviceCount()
        return f"[OK] GPU: CuPy {cupy.__version__} sees {n} device(s){f' ({gpu})' if gpu else ''}"
    except ImportError:
        if gpu:
            return (
                f"[--] GPU: {gpu}, but CuPy is not installed: "
                "`.venv/bin/pip install -e '.[gpu]'` enables the GPU cells"
            )
        return "[--] GPU: none found (fine: GPU cells skip and say so; the CPU path runs everything)"
    except Exception as e:  # CUDA runtime errors come in many classes
        return f"[--] GPU: CuPy is installed but cannot use a GPU ({type(e).__name__}: {e})"


def main() -> int:
    results = [check_python()]
    try:
        reqs = requirements()
    except (OSError, KeyError) as e:
        results.append((False, f"cannot read the dependency list from pyproject.toml: {e}"))
        reqs = []
    results += [check_distribution(n, b) for n, b in reqs]
    results.append(check_model())
    for ok, line in results:
        print(f"[{'OK' if ok else 'FAIL'}] {line}")
    print(check_gpu())
    failed = sum(not ok for ok, _ in results)
    print(f"\n{'all required checks passed' if not failed else f'{failed} check(s) failed'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
