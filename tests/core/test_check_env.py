"""``make check-env`` on this project's own environment, and the checker's reading of requirements.

The environment the tests run in is one ``make setup`` made, so every check must pass
(issue 32: a requirement with an extra, ``numba-cuda[cu13]``, was looked up under that
name and reported as not installed on every correct set-up). No GPU is needed: the GPU
line is information, never a failure.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from llmrs_core.workbook import check_env
from llmrs_core.workbook.check_env import Requirement, check_distribution, parse_requirement, requirements

REPO = Path(__file__).resolve().parents[2]


def test_make_check_env_passes_on_the_projects_environment(model_path):
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    venv = Path(sys.executable).parent.parent
    proc = subprocess.run(["make", "--no-print-directory", "check-env", f"VENV={venv}"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    failed = [line for line in proc.stdout.splitlines() if line.startswith("[FAIL]")]
    assert proc.returncode == 0 and not failed, proc.stdout + proc.stderr
    assert "all required checks passed" in proc.stdout
    assert "[OK] numba-cuda[cu13]" in proc.stdout, "the extra is named, and its packages checked"


def test_a_requirement_is_read_with_its_extras_bounds_and_marker():
    req, marker = parse_requirement("numba-cuda[cu13]>=0.30,<0.31")
    assert req == Requirement("numba-cuda", ("cu13",), "0.30", "0.31") and marker == ""
    assert req.label == "numba-cuda[cu13]"
    req, marker = parse_requirement("tbb>=2021.6; sys_platform == 'linux' and platform_machine == 'x86_64'")
    assert req == Requirement("tbb", (), "2021.6", "") and "platform_machine" in marker


def test_markers_of_other_machines_and_pythons_do_not_apply(monkeypatch):
    import platform

    marker = "sys_platform == 'linux' and platform_machine == 'x86_64'"
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setattr(platform, "machine", lambda: "aarch64")
    assert not check_env._marker_applies(marker), "tbb's wheel exists for x86-64 only"
    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    assert check_env._marker_applies(marker)
    assert check_env._marker_applies("python_version >= '3.10'")
    assert not check_env._marker_applies("python_version < '3.10'")
    assert check_env._marker_applies("python_version < '3.10' or sys_platform == 'linux'")


def test_every_extra_of_ours_is_expanded():
    names = {r.name for r in requirements()}
    assert {"fastapi", "mpi4py", "jupyterlab", "numba-cuda"} <= names, names
    assert "llmrs-core" not in names


def test_a_missing_package_of_an_extra_is_named(monkeypatch):
    real = check_env._installed
    monkeypatch.setattr(check_env, "_installed", lambda name: None if name == "cuda-toolkit" else real(name))
    ok, line = check_distribution(Requirement("numba-cuda", ("cu13",), "0.30", "0.31"))
    assert not ok and "its extra [cu13] needs cuda-toolkit" in line, line


def test_versions_outside_the_bounds_fail(monkeypatch):
    monkeypatch.setattr(check_env, "_installed", lambda name: "0.31.2")
    ok, line = check_distribution(Requirement("numba-cuda", (), "0.30", "0.31"))
    assert not ok and "need < 0.31" in line, line
    ok, line = check_distribution(Requirement("numba-cuda", (), "0.32", ""))
    assert not ok and "need >= 0.32" in line, line
    monkeypatch.setattr(check_env, "_installed", lambda name: None)
    ok, line = check_distribution(Requirement("numba-cuda", ("cu13",)))
    assert not ok and line == "numba-cuda[cu13]: not installed (run `make setup`)"
