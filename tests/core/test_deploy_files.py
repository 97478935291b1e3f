"""The deployment files (chapter 12.1) say what the README promises: the Dockerfile's base argument,
non-root user, health check, port and entrypoint; the Kubernetes probes and resources; the compose
file's services; a Prometheus config that `promtool` accepts (when installed); `deploy/build.sh`
writes its base root filesystem as a tar and re-creates a damaged cache of it (run with a stand-in
mmdebstrap: seconds, no root, no network). Building and running the image is `make container` /
`make container-test` (minutes: not part of `make test`).
"""

from __future__ import annotations

import io
import os
import re
import shlex
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile, continuation lines joined, comments dropped."""
    text = dockerfile.read_text().replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), " ".join(rest.split())))
    return out


def test_dockerfile_is_multi_stage_non_root_with_health_check():
    ins = instructions(DEPLOY / "Dockerfile")
    assert ins[0] == ("ARG", "BASE=python:3.12-slim"), "the base must be an ARG defaulting to python:3.12-slim"
    stages = [args for word, args in ins if word == "FROM"]
    assert stages == ["${BASE} AS wheels", "${BASE} AS runtime", "runtime AS baked"]
    runtime = ins[[i for i, (w, a) in enumerate(ins) if w == "FROM"][1]:]
    assert ("COPY", "--from=wheels /opt/llmrs /opt/llmrs") in runtime, "the runtime stage copies only the venv"
    users = [a for w, a in runtime if w == "USER"]
    assert users and users[-1].split(":")[0] not in ("0", "root"), "the server must not run as root"
    assert ("EXPOSE", "8000") in runtime
    health = [a for w, a in runtime if w == "HEALTHCHECK"]
    assert health and "/health" in health[0]
    assert ("ENTRYPOINT", '["llmrs", "serve"]') in runtime
    wheels = " ".join(a for w, a in ins[: [i for i, (w, a) in enumerate(ins) if w == "FROM"][1]] if w == "RUN")
    assert "--no-index --find-links /src/build/wheelhouse" in wheels, "the wheelhouse installs without network"


def test_dockerignore_lets_in_only_what_the_image_needs():
    lines = [x for x in (DEPLOY.parent / ".dockerignore").read_text().splitlines() if x and not x.startswith("#")]
    assert lines[0] == "*"
    assert {"!pyproject.toml", "!llmrs_core", "!build/wheelhouse"} <= set(lines)
    assert not any(x.startswith("!") and (".venv" in x or ".git" in x) for x in lines)


def test_kubernetes_deployment_probes_readiness_on_ready_liveness_on_health_and_has_resources():
    deployment = yaml.safe_load((DEPLOY / "k8s" / "deployment.yaml").read_text())
    assert deployment["kind"] == "Deployment"
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/ready"  # 503 while loading, draining, failed
    assert container["startupProbe"]["httpGet"]["path"] == "/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/health"  # 503 only when wedged
    assert {"cpu", "memory"} <= set(container["resources"]["requests"])
    assert {"cpu", "memory"} <= set(container["resources"]["limits"])
    service = yaml.safe_load((DEPLOY / "k8s" / "service.yaml").read_text())
    assert service["kind"] == "Service"
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]


def test_compose_runs_llmrs_and_prometheus_scraping_it():
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    assert {"llmrs", "prometheus"} <= set(compose["services"])
    assert compose["services"]["llmrs"]["build"]["dockerfile"] == "deploy/Dockerfile"
    config = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    targets = [t for job in config["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]]
    assert targets == ["llmrs:8000"]


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Debian's prometheus package) is not installed")
def test_promtool_accepts_the_scrape_config():
    r = subprocess.run(["promtool", "check", "config", str(DEPLOY / "prometheus.yml")], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


# -- deploy/build.sh's base root filesystem (issue 26 §4) ---------------------------------------------------
# mmdebstrap infers its output format from the target's name unless told; build.sh writes to
# rootfs.tar.partial, not a tar name, so without --format=tar it wrote a directory, renamed it rootfs.tar,
# and `podman import` failed on a fresh machine with "is a directory".


def mmdebstrap_commands(script: str) -> list[list[str]]:
    """The mmdebstrap command lines of a shell script (continuation lines joined, comments dropped)."""
    text = script.replace("\\\n", " ")
    lines = [line.split("#", 1)[0].strip() for line in text.splitlines()]
    return [shlex.split(line) for line in lines if re.match(r"mmdebstrap\s", line)]


def test_build_sh_asks_mmdebstrap_for_a_tar():
    script = (DEPLOY / "build.sh").read_text()
    (cmd,) = mmdebstrap_commands(script)
    assert "--format=tar" in cmd, "without it mmdebstrap picks the format from the target's name"
    assert "set -euo pipefail" in script


# mmdebstrap's stand-in: it logs its arguments, writes a tiny root filesystem holding usr/bin/python3, and
# picks the format like the real one: --format=tar, else a tar only when the name ends in .tar, else a
# directory (the bug)
FAKE_MMDEBSTRAP = """#!/usr/bin/env bash
set -euo pipefail
echo "$*" >> "$FAKE_LOG"
target=${*: -1}
root=$(mktemp -d)
mkdir -p "$root/usr/bin" && echo '#!/bin/sh' > "$root/usr/bin/python3"
if [[ " $* " == *" --format=tar "* || $target == *.tar ]]; then tar -C "$root" -cf "$target" . && rm -rf "$root"
else mv "$root" "$target"; fi
"""


@pytest.fixture
def tree(tmp_path):
    """A copy of build.sh and need.sh (build.sh works in the directory above its own) and a PATH whose
    mmdebstrap is the stand-in."""
    if shutil.which("bash") is None or shutil.which("tar") is None:
        pytest.skip("needs bash and tar")
    (tmp_path / "deploy").mkdir()
    for name in ("build.sh", "need.sh"):
        shutil.copy2(DEPLOY / name, tmp_path / "deploy" / name)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "mmdebstrap").write_text(FAKE_MMDEBSTRAP)
    (bin_dir / "mmdebstrap").chmod(0o755)
    (tmp_path / "build" / "container").mkdir(parents=True)
    return tmp_path


def run_rootfs(tree: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{tree / 'bin'}:{os.environ['PATH']}", "FAKE_LOG": str(tree / "mmdebstrap.log")}
    return subprocess.run(["bash", str(tree / "deploy" / "build.sh"), "rootfs"], env=env, capture_output=True,
                          text=True, timeout=60)


def a_tar(path: Path, members: dict[str, bytes]) -> None:
    with tarfile.open(path, "w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def damage(rootfs: Path, how: str) -> None:
    if how == "directory":  # what the bug left behind: mmdebstrap's directory output, renamed
        (rootfs / "usr" / "bin").mkdir(parents=True)
    elif how == "empty":
        rootfs.touch()
    elif how == "truncated":  # an mmdebstrap or copy cut short: tar -t stops at an unexpected EOF
        a_tar(rootfs, {"./usr/bin/python3": b"#!/bin/sh\n", "./big": os.urandom(64 * 1024)})
        rootfs.write_bytes(rootfs.read_bytes()[: 32 * 1024])
    elif how == "no python":
        a_tar(rootfs, {"./etc/hostname": b"x\n"})


def is_good_rootfs(path: Path) -> bool:
    with tarfile.open(path) as tar:
        return "./usr/bin/python3" in tar.getnames()


def test_build_sh_makes_a_missing_rootfs_as_a_tar(tree):
    r = run_rootfs(tree)
    rootfs = tree / "build" / "container" / "rootfs.tar"
    assert r.returncode == 0, r.stdout + r.stderr
    assert rootfs.is_file() and is_good_rootfs(rootfs)
    assert "--format=tar" in (tree / "mmdebstrap.log").read_text()
    assert not (tree / "build" / "container" / "rootfs.tar.partial").exists()


@pytest.mark.parametrize("how", ["directory", "empty", "truncated", "no python"])
def test_build_sh_remakes_a_damaged_rootfs_and_says_so(tree, how):
    rootfs = tree / "build" / "container" / "rootfs.tar"
    damage(rootfs, how)
    r = run_rootfs(tree)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "making it again" in r.stderr and "rootfs.tar is" in r.stderr, r.stderr
    assert rootfs.is_file() and is_good_rootfs(rootfs)
    assert len((tree / "mmdebstrap.log").read_text().splitlines()) == 1


def test_build_sh_keeps_a_good_rootfs_and_clears_a_leftover_partial(tree):
    rootfs = tree / "build" / "container" / "rootfs.tar"
    a_tar(rootfs, {"./usr/bin/python3": b"#!/bin/sh\n"})
    before = rootfs.read_bytes()
    r = run_rootfs(tree)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert rootfs.read_bytes() == before and not (tree / "mmdebstrap.log").exists(), "a good cache is kept"
    # an interrupted run's leftover (a directory, before the fix) must not stop the next mmdebstrap
    rootfs.unlink()
    (tree / "build" / "container" / "rootfs.tar.partial" / "usr").mkdir(parents=True)
    r = run_rootfs(tree)
    assert r.returncode == 0, r.stdout + r.stderr
    assert is_good_rootfs(rootfs)
