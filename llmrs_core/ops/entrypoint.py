"""A container's entrypoint: check the environment, fail fast with a clear message, then serve (chapter 12).

A container is configured by environment variables (``docker run -e``, a
Kubernetes ``env:`` list, compose's ``environment:``). A typo there should stop
the container at once with a message naming the variable, not leave it crash
looping on a traceback from deep inside the model loader five seconds later, or
worse, start and serve on the wrong port. The variables:

=================  ==========================================  =====================================
``LLMRS_MODEL``    a GGUF file (``GGUF`` magic in its first    ``/models/SmolLM2-135M-Instruct.Q4_1.gguf``
                   four bytes)
``LLMRS_HOST``     the address to listen on                    ``0.0.0.0`` (every interface: inside a
                                                               container that is what ``-p`` reaches)
``LLMRS_PORT``     an integer in 1..65535                      ``8000``
``LLMRS_THREADS``  a positive integer, at most the cores this  unset: every core
                   process may run on
``LLMRS_BACKEND``  one of the engine's backends                ``numba``
=================  ==========================================  =====================================

(``LLMRS_API_KEY`` is read by ``llmrs serve`` itself.) Every problem is found
before any is reported, so one failed start lists them all.

``python -m llmrs_core.ops.entrypoint [--checker FILE] [--check-only] [SERVE_ARGS ...]``
checks ``os.environ`` with :func:`check_serve_environment` (or with the function of
that name in ``FILE``: Exercise 12.6's image runs the learner's), then runs
``llmrs serve`` with the settings, ``SERVE_ARGS`` appended (``--port 9000`` there
wins over ``LLMRS_PORT``, as argparse keeps the last). A bad environment exits
with status 78 (``EX_CONFIG`` of ``sysexits.h``) and one line per problem on stderr.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from ..backends import BACKENDS, DEFAULT_BACKEND
from ..formats.gguf import GGUF_MAGIC

DEFAULT_MODEL = "/models/SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_HOST = "0.0.0.0"
DEFAULT_PORT = 8000
#: the exit status of a container whose configuration is wrong (sysexits.h's EX_CONFIG)
EX_CONFIG = 78


class ServeEnvironmentError(ValueError):
    """The environment cannot start a server; ``problems`` has one sentence per variable at fault."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        n = len(self.problems)
        super().__init__(f"the server cannot start: {n} problem{'s' * (n != 1)} in its environment:\n  "
                         + "\n  ".join(self.problems))


@dataclass(frozen=True)
class ServeSettings:
    """What ``llmrs serve`` is started with. ``threads=None``: every core."""

    model: Path
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    threads: int | None = None
    backend: str = DEFAULT_BACKEND

    def serve_argv(self) -> list[str]:
        """``llmrs`` arguments that serve with these settings: ``["serve", MODEL, "--host", ...]``."""
        argv = ["serve", str(self.model), "--host", self.host, "--port", str(self.port), "--backend", self.backend]
        if self.threads is not None:
            argv += ["--threads", str(self.threads)]
        return argv


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity: a container's ``--cpuset-cpus``)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - macOS, Windows
        return os.cpu_count() or 1


def _integer(text: str) -> int | None:
    """``text`` as a plain decimal integer (``"8000"``, not ``"8e3"``, ``"8000.0"`` or ``"0x1f40"``), else None."""
    text = text.strip()
    digits = text[1:] if text[:1] in "+-" else text
    return int(text) if digits.isdigit() and digits.isascii() else None


def _model_problem(path: Path) -> str | None:
    if not path.exists():
        return f"LLMRS_MODEL={str(path)!r}: no such file (mount the model there, or bake it into the image)"
    if path.is_dir():
        return f"LLMRS_MODEL={str(path)!r} is a directory; give the .gguf file inside it"
    try:
        with path.open("rb") as f:
            head = f.read(4)
    except OSError as e:
        return f"LLMRS_MODEL={str(path)!r} cannot be read: {e.strerror or e}"
    if head != GGUF_MAGIC:
        return f"LLMRS_MODEL={str(path)!r} is not a GGUF file: it starts with {head!r}, not {GGUF_MAGIC!r}"
    return None


def check_serve_environment(env: Mapping[str, str], cpu_count: int | None = None) -> ServeSettings:
    """The :class:`ServeSettings` the variables of ``env`` ask for (the table in the module's docstring).

    ``cpu_count``: the cores ``LLMRS_THREADS`` may not exceed (default :func:`usable_cores`).
    Raises :class:`ServeEnvironmentError` listing every variable at fault.
    """
    cores = usable_cores() if cpu_count is None else cpu_count
    problems = []
    model = Path(env.get("LLMRS_MODEL", DEFAULT_MODEL))
    if (p := _model_problem(model)) is not None:
        problems.append(p)
    host = env.get("LLMRS_HOST", DEFAULT_HOST).strip()
    if not host:
        problems.append("LLMRS_HOST is empty; give an address to listen on (0.0.0.0: every interface)")
    port = DEFAULT_PORT
    if "LLMRS_PORT" in env:
        value = _integer(env["LLMRS_PORT"])
        if value is None or not 1 <= value <= 65535:
            problems.append(f"LLMRS_PORT={env['LLMRS_PORT']!r}: a port is an integer from 1 to 65535")
        else:
            port = value
    threads = None
    if env.get("LLMRS_THREADS", "").strip():
        value = _integer(env["LLMRS_THREADS"])
        if value is None or value < 1:
            problems.append(f"LLMRS_THREADS={env['LLMRS_THREADS']!r}: give a positive integer (or leave it unset "
                            "for every core)")
        elif value > cores:
            problems.append(f"LLMRS_THREADS={value}: this container may use only {cores} core{'s' * (cores != 1)}; "
                            "more threads than cores only contend")
        else:
            threads = value
    backend = env.get("LLMRS_BACKEND", DEFAULT_BACKEND).strip()
    if backend not in BACKENDS:
        problems.append(f"LLMRS_BACKEND={backend!r}: not a backend of the engine; choose one of "
                        f"{', '.join(BACKENDS)}")
    if problems:
        raise ServeEnvironmentError(problems)
    return ServeSettings(model, host, port, threads, backend)


Checker = Callable[[Mapping[str, str]], ServeSettings]


def load_checker(path: str | Path) -> Checker:
    """The ``check_serve_environment`` function defined in the Python file ``path`` (a learner's exercises)."""
    path = Path(path)
    spec = importlib.util.spec_from_file_location("llmrs_entrypoint_checker", path)
    if spec is None or spec.loader is None:
        raise ValueError(f"--checker {path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    checker = module.__dict__.get("check_serve_environment")
    if not callable(checker):
        raise ValueError(f"--checker {path} defines no check_serve_environment function")
    return checker


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m llmrs_core.ops.entrypoint",
                                description="check the container's environment, then run llmrs serve")
    p.add_argument("--checker", metavar="FILE", help="a Python file whose check_serve_environment checks the "
                                                     "environment (default: the engine's)")
    p.add_argument("--check-only", action="store_true", help="print the llmrs serve command and exit")
    args, serve_args = p.parse_known_args(argv)
    check = load_checker(args.checker) if args.checker else check_serve_environment
    which = f"check_serve_environment of {args.checker} (Exercise 12.6)" if args.checker else "the checker"
    try:
        settings = check(os.environ)
    except ServeEnvironmentError as e:
        print(f"llmrs entrypoint: {e}", file=sys.stderr)
        return EX_CONFIG
    except Exception as e:  # a checker with a bug: one line naming it, not a traceback
        print(f"llmrs entrypoint: {which} raised {type(e).__name__}: {e} (a bad environment is "
              "ServeEnvironmentError's to report)", file=sys.stderr)
        return EX_CONFIG
    if not isinstance(settings, ServeSettings):
        print(f"llmrs entrypoint: {which} returned {type(settings).__name__}, not ServeSettings",
              file=sys.stderr)
        return EX_CONFIG
    command = [*settings.serve_argv(), *serve_args]
    print("llmrs " + " ".join(command), file=sys.stderr)
    if args.check_only:
        return 0
    from ..cli import main as llmrs

    return llmrs(command)


if __name__ == "__main__":
    # run the package's module, not this __main__ copy: a checker (the learner's file) imports
    # ServeSettings and ServeEnvironmentError from llmrs_core.ops.entrypoint, and those must be
    # the classes main() checks against
    from llmrs_core.ops.entrypoint import main as _main

    sys.exit(_main())
