"""``make check-env``: is this machine ready for the workbook?

Prints one ``[OK]`` / ``[FAIL]`` line for Python, each dependency named in
pyproject.toml (the engine's, the notebooks' and the tests'), the model file,
and whether a GPU is usable. Runs with the standard library alone, so it can
explain a broken environment instead of crashing in it. Exit status 1 if
anything required fails; no GPU is fine.

Run it as ``python llmrs_core/workbook/check_env.py`` (that is what the Makefile does).
"""

from __future__ import annotations

import importlib.metadata as metadata
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MIN_PYTHON = (3, 10)


def _load_fetch_module():
    """llmrs_core/fetch.py uses only the standard library; load it without the package
    (whose __init__ imports NumPy, which may be the thing that is missing)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("_llmrs_fetch", Path(__file__).parent.parent / "fetch.py")
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


_MARKER = re.compile(r"""^\s*(python_version|sys_platform|platform_machine)\s*(<=|>=|==|!=|<|>)\s*['"]([^'"]*)['"]\s*$""")


def _marker_applies(marker: str) -> bool:
    """Evaluate the environment markers pyproject.toml uses: ``python_version``, ``sys_platform``
    and ``platform_machine`` compared with a literal, joined by ``and`` / ``or`` (no brackets).
    A marker of any other form counts as applying: the check then asks for the package."""
    import platform

    have = {"python_version": sys.version_info[:2], "sys_platform": sys.platform,
            "platform_machine": platform.machine()}

    def atom(text: str) -> bool:
        m = _MARKER.match(text)
        if not m:
            return True
        name, op, value = m.groups()
        left, right = have[name], _version_tuple(value) if name == "python_version" else value
        return {"<": left < right, "<=": left <= right, ">": left > right, ">=": left >= right,
                "==": left == right, "!=": left != right}[op]

    if not marker.strip() or "(" in marker:
        return True
    return any(all(atom(a) for a in alternative.split(" and ")) for alternative in marker.split(" or "))


#: ``name[extra1,extra2] >=1.0,<2 ; marker``, as PEP 508 writes a requirement (URLs aside)
_REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._\-]*)\s*(?:\[([^\]]*)\])?\s*([^;]*?)\s*(?:;(.*))?$")


@dataclass(frozen=True)
class Requirement:
    """One dependency: the distribution's name (without its extras), the extras asked for,
    and the version bounds ``>=`` and ``<`` (others are not checked)."""

    name: str
    extras: tuple[str, ...] = ()
    lower: str = ""
    upper: str = ""

    @property
    def label(self) -> str:
        return self.name + (f"[{','.join(self.extras)}]" if self.extras else "")


def parse_requirement(spec: str) -> tuple[Requirement, str] | None:
    """``(Requirement, marker)`` of a PEP 508 string, None for one this checker cannot read."""
    m = _REQUIREMENT.match(spec)
    if not m:
        return None
    name, extras, versions, marker = m.groups()
    bounds = dict(re.findall(r"(>=|<)\s*([\w.*]+)", versions or ""))
    return Requirement(name, tuple(e.strip() for e in (extras or "").split(",") if e.strip()),
                       bounds.get(">=", ""), bounds.get("<", "")), (marker or "")


def requirements(groups: tuple[str, ...] = ("lab", "dev")) -> list[Requirement]:
    """The dependencies in pyproject.toml and its extras ``groups`` that apply to this machine.

    An extra that names this project again (``llmrs-core[serve]`` in ``dev``) brings in
    that extra's list, so every package ``make setup`` installs is checked.
    """
    text = (ROOT / "pyproject.toml").read_text()
    try:
        import tomllib
    except ImportError:  # Python 3.10
        try:
            import tomli as tomllib  # type: ignore[no-redef]
        except ImportError:
            tomllib = None  # type: ignore[assignment]
    if tomllib is None:  # a rough parse is enough to report on: every quoted requirement in the file
        specs, extras, this = re.findall(r'^\s*"([A-Za-z0-9][^"]*)",?', text, re.M), {}, "llmrs-core"
    else:
        project = tomllib.loads(text)["project"]
        specs, extras, this = list(project["dependencies"]), project.get("optional-dependencies", {}), project["name"]
    specs += [f"{this}[{g}]" for g in groups]  # the groups asked for, expanded below as any extra of ours is
    expanded: set[str] = set()
    out: dict[str, Requirement] = {}
    for spec in specs:  # grows while it runs: llmrs-core[serve] in dev adds the serve extra's list
        parsed = parse_requirement(spec)
        if parsed is None or not _marker_applies(parsed[1]):
            continue
        req = parsed[0]
        if req.name == this:
            for extra in set(req.extras) - expanded:
                expanded.add(extra)
                specs.extend(extras.get(extra, []))
            continue
        known = out.get(req.name.lower())
        if known is None or len(req.extras) > len(known.extras):  # numba-cuda[cu13] over numba-cuda
            out[req.name.lower()] = req
    return list(out.values())


def _extra_requirements(name: str, extra: str) -> list[Requirement]:
    """What the installed distribution ``name`` declares for ``extra`` (its metadata's
    ``Requires-Dist: ...; extra == "cu13"``), for this machine."""
    found = []
    for spec in metadata.requires(name) or []:
        parsed = parse_requirement(spec)
        if parsed is None:
            continue
        req, marker = parsed
        wanted = re.search(r"""extra\s*==\s*['"]([^'"]+)['"]""", marker)
        if wanted is None or wanted.group(1) != extra:
            continue
        rest = re.sub(r"""(\band\s+)?\(?\s*extra\s*==\s*['"][^'"]+['"]\s*\)?(\s+and\b)?""", "", marker)
        if _marker_applies(rest.strip().strip("()")):
            found.append(req)
    return found


def check_python() -> tuple[bool, str]:
    v = sys.version_info
    ok = (v.major, v.minor) >= MIN_PYTHON
    need = ".".join(map(str, MIN_PYTHON))
    return ok, f"Python {v.major}.{v.minor}.{v.micro} at {sys.executable} (need >= {need})"


def _installed(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def check_distribution(req: Requirement) -> tuple[bool, str]:
    """Is ``req`` installed, within its bounds, with the packages its extras bring?"""
    have = _installed(req.name)
    if have is None:
        return False, f"{req.label}: not installed (run `make setup`)"
    if req.lower and _version_tuple(have) < _version_tuple(req.lower):
        return False, f"{req.label} {have}: need >= {req.lower} (run `make setup`)"
    if req.upper and _version_tuple(have) >= _version_tuple(req.upper):
        return False, f"{req.label} {have}: need < {req.upper} (run `make setup`)"
    bounds = ", ".join(b for b in (req.lower and f">= {req.lower}", req.upper and f"< {req.upper}") if b)
    line = f"{req.label} {have}" + (f" ({bounds})" if bounds else "")
    for extra in req.extras:
        brought = _extra_requirements(req.name, extra)
        missing = [r.name for r in brought if _installed(r.name) is None]
        if missing:
            return False, (f"{req.label} {have}: its extra [{extra}] needs {', '.join(missing)}, "
                           "not installed (run `make setup`)")
        line += f"; [{extra}]: {len(brought)} package{'s' if len(brought) != 1 else ''} present"
    return True, line


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
    results += [check_distribution(r) for r in reqs]
    results.append(check_model())
    for ok, line in results:
        print(f"[{'OK' if ok else 'FAIL'}] {line}")
    print(check_gpu())
    failed = sum(not ok for ok, _ in results)
    print(f"\n{'all required checks passed' if not failed else f'{failed} check(s) failed'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
