"""``make lab`` as root (issue 32, item 8): Jupyter refuses root without ``--allow-root``, and root
is the usual user in containers and cloud notebooks. The target adds the flag there, saying so in
one line, and not otherwise. A fake ``jupyter`` records its arguments; one test starts the real
JupyterLab as whoever runs the tests and waits for its URL.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
NOTICE = "make lab: running as root (as in most containers): JupyterLab starts with --allow-root"

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def make_lab(venv: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "--no-print-directory", "lab", f"VENV={venv}", "-o", str(venv / ".llmrs-setup.stamp"),
                           *args], cwd=REPO, capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def fake_venv(tmp_path):
    (tmp_path / "bin").mkdir()
    jupyter = tmp_path / "bin" / "jupyter"
    jupyter.write_text('#!/bin/sh\necho "jupyter $*"\n')
    jupyter.chmod(0o755)
    return tmp_path


def test_as_root_the_flag_is_added_and_said(fake_venv):
    proc = make_lab(fake_venv, "AS_ROOT=1")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [NOTICE, "jupyter lab --notebook-dir=chapters --allow-root"], proc.stdout


def test_as_another_user_nothing_is_added(fake_venv):
    proc = make_lab(fake_venv, "AS_ROOT=", "LAB_ARGS=--no-browser")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["jupyter lab --notebook-dir=chapters --no-browser"], proc.stdout


def test_the_user_is_detected(fake_venv):
    out = make_lab(fake_venv).stdout
    assert ("--allow-root" in out) == (os.geteuid() == 0), out
    assert (NOTICE in out) == (os.geteuid() == 0), out


def test_the_real_jupyterlab_starts(tmp_path):
    venv = Path(sys.executable).parent.parent
    if not (venv / "bin" / "jupyter").exists():
        pytest.skip("no jupyter in this environment")
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"), "JUPYTER_CONFIG_DIR": str(tmp_path / "config")}
    args = "LAB_ARGS=--no-browser --port=0 --ServerApp.ip=127.0.0.1 --IdentityProvider.token="
    proc = subprocess.Popen(["make", "--no-print-directory", "lab", f"VENV={venv}", "-o",
                             str(venv / ".llmrs-setup.stamp"), args], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True)
    seen = []
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            seen.append(line)
            if "http://127.0.0.1:" in line:
                break
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # make and the jupyter it started: the session of this Popen
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    out = "".join(seen)
    assert "http://127.0.0.1:" in out, f"JupyterLab did not start:\n{out}"
    assert "Running as root is not recommended. Use --allow-root" not in out
