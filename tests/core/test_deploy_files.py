"""The deployment files (chapter 12.1) say what the README promises: the Dockerfile's base argument,
non-root user, health check, port and entrypoint; the Kubernetes probes and resources; the compose
file's services; a Prometheus config that `promtool` accepts (when installed). Building and running
the image is `make container` / `make container-test` (minutes: not part of `make test`).
"""

from __future__ import annotations

import shutil
import subprocess
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
