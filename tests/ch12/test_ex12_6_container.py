"""Exercise 12.6 — the learner's Dockerfile, built and run: a bad environment stops the container at once,
a good one serves a chat completion through the ``openai`` client as a non-root user.

``chapters/ch12_production/Dockerfile`` is built with buildah on the image ``make container`` makes, with
the module under test (the learner's exercises.py, or the solutions) as its checker; then run with
``buildah run`` (chroot isolation shares the host's network). It takes minutes, so ``make test`` skips it:
``make container-test-learner`` runs it (buildah installed, ``make container`` built first).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BASE_IMAGE = os.environ.get("LLMRS_IMAGE", "localhost/llmrs:latest")

pytestmark = pytest.mark.skipif(
    not (shutil.which("buildah") and os.environ.get("LLMRS_CONTAINER_TESTS") == "1"),
    reason="builds and runs a container image (minutes): `make container` once, then "
           "`make container-test-learner` (or LLMRS_CONTAINER_TESTS=1 with buildah installed)")


def container_test():
    """deploy/container_test.py, the checks of `make container-test`, as a module."""
    spec = importlib.util.spec_from_file_location("container_test", ROOT / "deploy" / "container_test.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def buildah(*args: str, timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["buildah", *args], capture_output=True, text=True, timeout=timeout, check=check)


@pytest.fixture(scope="module")
def learner_image(tmp_path_factory):
    """``build(ex)``: the learner's Dockerfile built with ``ex``'s file as its checker (once); removed after."""
    built: dict[str, str] = {}

    def build(ex) -> str:
        if ex.__file__ in built:
            return built[ex.__file__]
        if buildah("inspect", "--type", "image", BASE_IMAGE, check=False).returncode != 0:
            pytest.fail(f"no image {BASE_IMAGE}: run `make container` first")
        context = tmp_path_factory.mktemp("learner-image")
        shutil.copy(ROOT / "chapters" / "ch12_production" / "Dockerfile", context / "Dockerfile")
        shutil.copy(ex.__file__, context / "exercises.py")
        image = f"localhost/llmrs-learner-test:{os.getpid()}-{len(built)}"
        r = buildah("bud", "--isolation", "chroot", "--pull=never", "--quiet", "--build-arg", f"IMAGE={BASE_IMAGE}",
                    "-t", image, str(context), check=False)
        assert r.returncode == 0, f"buildah bud of your Dockerfile failed:\n{r.stderr[-2000:]}"
        built[ex.__file__] = image
        return image

    yield build
    for image in built.values():
        buildah("rmi", "-f", image, check=False, timeout=120)


def run_in(image: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    """The image's ENTRYPOINT + ``args`` in a fresh container with ``env`` added; the container removed after."""
    config = container_test().image_config(image)
    name = f"llmrs-learner-env-{os.getpid()}"
    buildah("from", "--pull-never", "--name", name, image, timeout=120)
    try:
        env_args = [a for k, v in env.items() for a in ("--env", f"{k}={v}")]
        return buildah("run", "--isolation", "chroot", *env_args, name, "--", *(config.get("Entrypoint") or []),
                       *args, check=False, timeout=300)
    finally:
        buildah("rm", name, check=False, timeout=120)


def test_ex12_6_container_with_a_bad_environment_stops_at_once(ex, learner_image):
    from llmrs_core.ops.entrypoint import ServeEnvironmentError

    with pytest.raises(ServeEnvironmentError):  # in-process first: a stub or a crash shows here, in seconds
        ex.check_serve_environment({"LLMRS_PORT": "0"}, 1)
    r = run_in(learner_image(ex), {"LLMRS_PORT": "99999", "LLMRS_THREADS": "0"}, "--check-only")
    assert r.returncode == 78, (f"the container should stop with status 78 (EX_CONFIG), before loading the model; "
                                f"it exited {r.returncode}:\n{r.stderr[-1500:]}")
    for variable in ("LLMRS_PORT", "LLMRS_THREADS"):
        assert variable in r.stderr, f"the container's message should name {variable}:\n{r.stderr[-1500:]}"


def test_ex12_6_container_with_its_own_environment_serves(ex, learner_image):
    from llmrs_core.ops.entrypoint import ServeEnvironmentError

    with pytest.raises(ServeEnvironmentError):  # in-process first, as above
        ex.check_serve_environment({"LLMRS_MODEL": str(ROOT / "no-such-model.gguf")}, 1)
    image = learner_image(ex)
    r = run_in(image, {}, "--check-only")
    assert r.returncode == 0, f"the image's own environment should pass your check:\n{r.stderr[-1500:]}"
    results = container_test().check(image, start_timeout=300)
    failed = [f"{what}: {detail}" for what, ok, detail in results if not ok]
    assert len(results) == 3 and not failed, f"the container did not serve: {failed or results}"
