"""Exercise 12.6 — Deploying with Docker: the container entrypoint's environment check.

The learner's ``check_serve_environment`` runs in-process on real files (a GGUF the project writes,
checked as GGUF by the ``gguf`` package, no one here wrote it; a safetensors file; a directory), and
its settings are fed to ``llmrs serve``'s own argument parser. The container test that builds and runs
the learner's Dockerfile is ``test_ex12_6_container.py`` (only with buildah and LLMRS_CONTAINER_TESTS=1).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from llmrs_core.backends import BACKENDS
from llmrs_core.ops.entrypoint import (
    DEFAULT_BACKEND,
    DEFAULT_HOST,
    DEFAULT_PORT,
    ServeEnvironmentError,
    ServeSettings,
)
from llmrs_core.testing import write_tiny_llama

CORES = 4  # the cpu_count every call passes, so the checks do not depend on this machine


@pytest.fixture(scope="module")
def gguf(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("entrypoint") / "tiny.gguf"
    write_tiny_llama(path, byte_tokenizer=True)
    gguf_pkg = pytest.importorskip("gguf")
    gguf_pkg.GGUFReader(path)  # a reader no one here wrote agrees that it is a GGUF file
    return path


def check(ex, env: dict[str, str], cores: int = CORES, why: str = "") -> ServeSettings:
    """The learner's settings for a good ``env``; a refusal fails with its problems and ``why`` it is good."""
    try:
        return ex.check_serve_environment(env, cores)
    except ServeEnvironmentError as e:
        pytest.fail(f"your check refused {env} (cpu_count={cores}), a good environment: {e.problems}"
                    + (f"; {why}" if why else ""))


def problems(ex, env: dict[str, str], cores: int = CORES, why: str = "") -> list[str]:
    """The problems the learner's check reports for ``env`` (it must raise ServeEnvironmentError)."""
    try:
        settings = ex.check_serve_environment(env, cores)
    except ServeEnvironmentError as e:
        assert e.problems, "raise ServeEnvironmentError with a list of problems, one sentence each"
        return e.problems
    except NotImplementedError:
        raise
    except Exception as e:  # noqa: BLE001 - the learner's mistake, named
        pytest.fail(f"for {env} your check raised {type(e).__name__}: {e}; raise ServeEnvironmentError([...]) "
                    "naming the variable, so the container says what to fix")
    pytest.fail(f"your check accepted {env} (cpu_count={cores}; it returned {settings}); a container started with "
                "it would fail later, far from its cause" + (f": {why}" if why else ""))


def one_problem(ex, env: dict[str, str], variable: str, cores: int = CORES, why: str = "") -> str:
    found = problems(ex, env, cores, why)
    assert len(found) == 1, f"{env} has one problem, in {variable}; you reported {len(found)}: {found}"
    assert found[0].startswith(variable), (
        f"start each problem with the variable's name ({variable}), so the operator knows what to fix: {found[0]!r}")
    return found[0]


def test_ex12_6_a_good_environment_gives_its_settings(ex, gguf):
    env = {"LLMRS_MODEL": str(gguf), "LLMRS_HOST": "127.0.0.1", "LLMRS_PORT": "9000", "LLMRS_THREADS": "2",
           "LLMRS_BACKEND": "numpy"}
    got = check(ex, env)
    assert isinstance(got, ServeSettings), f"return a ServeSettings; got {type(got).__name__}"
    assert got == ServeSettings(gguf, "127.0.0.1", 9000, 2, "numpy"), (
        f"the settings should be what the variables say: {got}")
    assert isinstance(got.model, Path) and isinstance(got.port, int) and isinstance(got.threads, int), (
        "model is a Path, port and threads are ints (not the variables' strings)")


def test_ex12_6_unset_variables_take_the_defaults(ex, gguf):
    got = check(ex, {"LLMRS_MODEL": str(gguf)})
    assert (got.host, got.port, got.threads, got.backend) == (DEFAULT_HOST, DEFAULT_PORT, None, DEFAULT_BACKEND), (
        f"unset LLMRS_HOST/PORT/THREADS/BACKEND mean {DEFAULT_HOST}, {DEFAULT_PORT}, every core (None) and "
        f"{DEFAULT_BACKEND}; got {got}")
    empty = "an empty LLMRS_THREADS (compose's `LLMRS_THREADS:` with no value) means every core, like unset"
    assert check(ex, {"LLMRS_MODEL": str(gguf), "LLMRS_THREADS": ""}, why=empty).threads is None, empty


def test_ex12_6_the_settings_are_what_llmrs_serve_parses(ex, gguf):
    from llmrs_core.cli import build_parser

    got = check(ex, {"LLMRS_MODEL": str(gguf), "LLMRS_PORT": "8123", "LLMRS_THREADS": "3", "LLMRS_BACKEND": "numba"})
    args = build_parser().parse_args(got.serve_argv())  # the real command line's parser
    assert (args.model, args.host, args.port, args.threads, args.backend) == (
        str(gguf), got.host, 8123, 3, "numba"), f"llmrs serve would not get your settings: {args}"


def test_ex12_6_a_missing_model_names_the_variable_and_the_path(ex, tmp_path):
    path = tmp_path / "models" / "absent.gguf"
    message = one_problem(ex, {"LLMRS_MODEL": str(path)}, "LLMRS_MODEL")
    assert str(path) in message, f"say which path is missing (a volume not mounted?): {message!r}"
    if not os.path.exists("/models/SmolLM2-135M-Instruct.Q4_1.gguf"):  # absent outside the image
        assert any(p.startswith("LLMRS_MODEL") for p in problems(ex, {})), (
            "with LLMRS_MODEL unset, the default /models/SmolLM2-135M-Instruct.Q4_1.gguf is checked too")


def test_ex12_6_a_directory_is_not_a_model(ex, tmp_path):
    message = one_problem(ex, {"LLMRS_MODEL": str(tmp_path)}, "LLMRS_MODEL")
    assert "director" in message.lower(), f"a directory given as the model should be called one: {message!r}"


def test_ex12_6_a_file_that_is_not_gguf_is_refused(ex, tmp_path):
    safetensors = pytest.importorskip("safetensors.numpy")
    import numpy as np

    st = tmp_path / "model.safetensors"
    safetensors.save_file({"w": np.zeros((2, 2), np.float32)}, str(st))  # a real model file of another format
    magic = "a model file must start with GGUF_MAGIC (b'GGUF'): read its first four bytes and compare"
    message = one_problem(ex, {"LLMRS_MODEL": str(st)}, "LLMRS_MODEL", why=magic)
    assert "gguf" in message.lower(), f"say that the file is not GGUF: {message!r}"
    short = tmp_path / "short.gguf"
    short.write_bytes(b"GG")  # a download cut short: fewer than four bytes
    one_problem(ex, {"LLMRS_MODEL": str(short)}, "LLMRS_MODEL", why=magic + " (this one has only two bytes)")


@pytest.mark.parametrize("port", ["0", "65536", "-1", "80a", "8000.0", "", "http"])
def test_ex12_6_a_port_outside_1_to_65535_is_refused(ex, gguf, port):
    message = one_problem(ex, {"LLMRS_MODEL": str(gguf), "LLMRS_PORT": port}, "LLMRS_PORT",
                          why="a port is a plain decimal integer from 1 to 65535")
    assert repr(port) in message or port in message, f"show the value you refused ({port!r}): {message!r}"


@pytest.mark.parametrize("port", ["1", "65535"])
def test_ex12_6_the_ends_of_the_port_range_are_allowed(ex, gguf, port):
    inclusive = f"ports go from 1 to 65535 inclusive; {port} is one (check 1 <= port <= 65535)"
    assert check(ex, {"LLMRS_MODEL": str(gguf), "LLMRS_PORT": port}, why=inclusive).port == int(port), inclusive


@pytest.mark.parametrize("threads", ["0", "-2", "two", "1.5"])
def test_ex12_6_threads_must_be_a_positive_integer(ex, gguf, threads):
    one_problem(ex, {"LLMRS_MODEL": str(gguf), "LLMRS_THREADS": threads}, "LLMRS_THREADS",
                why="LLMRS_THREADS is a plain decimal integer of at least 1")


def test_ex12_6_threads_may_not_exceed_the_cores(ex, gguf):
    # cpu_count is given in every call: with more cores than any machine has, and with fewer, so that a check
    # counting this machine's cores instead gets one of them wrong, whichever machine runs it
    argument = "compare LLMRS_THREADS with the cpu_count argument (when given), not with this machine's cores"
    many = 4 * (os.cpu_count() or 1)
    assert check(ex, {"LLMRS_MODEL": str(gguf), "LLMRS_THREADS": str(many)}, many, why=argument).threads == many, (
        "as many threads as cores is allowed")
    message = one_problem(ex, {"LLMRS_MODEL": str(gguf), "LLMRS_THREADS": "2"}, "LLMRS_THREADS", 1, why=argument)
    assert "1 core" in message, f"say how many cores the container may use (1): {message!r}"
    message = one_problem(ex, {"LLMRS_MODEL": str(gguf), "LLMRS_THREADS": str(CORES + 1)}, "LLMRS_THREADS", CORES,
                          why=argument)
    assert str(CORES) in message, f"say how many cores the container may use ({CORES}): {message!r}"
    assert check(ex, {"LLMRS_MODEL": str(gguf), "LLMRS_THREADS": "1"}, 1, why=argument).threads == 1, argument


@pytest.mark.parametrize("host", ["", "   "])
def test_ex12_6_an_empty_host_is_refused(ex, gguf, host):
    one_problem(ex, {"LLMRS_MODEL": str(gguf), "LLMRS_HOST": host}, "LLMRS_HOST",
                why="an empty LLMRS_HOST (compose's `LLMRS_HOST:` with no value) is no address to listen on; "
                    "refuse it (0.0.0.0 listens on every interface)")


def test_ex12_6_an_unknown_backend_lists_the_known_ones(ex, gguf):
    message = one_problem(ex, {"LLMRS_MODEL": str(gguf), "LLMRS_BACKEND": "cuda12"}, "LLMRS_BACKEND")
    missing = [b for b in BACKENDS if b not in message]
    assert not missing, f"list the backends one may choose ({', '.join(BACKENDS)}); missing {missing}: {message!r}"
    for backend in BACKENDS:
        assert check(ex, {"LLMRS_MODEL": str(gguf), "LLMRS_BACKEND": backend}).backend == backend


def test_ex12_6_every_problem_is_reported_at_once(ex, tmp_path):
    env = {"LLMRS_MODEL": str(tmp_path / "absent.gguf"), "LLMRS_PORT": "99999", "LLMRS_THREADS": "0",
           "LLMRS_BACKEND": "tpu"}
    found = problems(ex, env)
    named = {v for v in env if any(p.startswith(v) for p in found)}
    assert named == set(env), (
        f"check every variable before raising, so one failed start lists all that is wrong; you reported "
        f"{sorted(named)} of {sorted(env)}: {found}")
    assert len(found) == 4, f"one problem per variable: {found}"


def test_ex12_6_the_entrypoint_runs_your_check_in_a_process_of_its_own(ex, gguf):
    import subprocess
    import sys

    check(ex, {"LLMRS_MODEL": str(gguf)})  # in-process first: a stub or a crash shows here
    command = [sys.executable, "-m", "llmrs_core.ops.entrypoint", "--checker", ex.__file__, "--check-only"]
    env = {**os.environ, "LLMRS_MODEL": str(gguf), "LLMRS_PORT": "0", "LLMRS_THREADS": "0"}
    bad = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 78, (f"with a bad environment the container's entrypoint should exit with 78 "
                                  f"(EX_CONFIG); it exited {bad.returncode}:\n{bad.stderr[-1500:]}")
    assert "LLMRS_PORT" in bad.stderr and "LLMRS_THREADS" in bad.stderr, bad.stderr
    env.update(LLMRS_PORT="8001", LLMRS_THREADS="1")
    good = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert good.returncode == 0, f"a good environment should pass:\n{good.stderr[-1500:]}"
    assert f"--port 8001 --backend {DEFAULT_BACKEND} --threads 1" in good.stderr, good.stderr
