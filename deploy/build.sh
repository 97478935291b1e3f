#!/usr/bin/env bash
# `make container`: build the llmrs image (deploy/Dockerfile) on this machine.
#
#   IMAGE   the tag to build (default localhost/llmrs:latest)
#   TARGET  baked (default: SmolLM2 inside) or runtime (mount a model at /models)
#   BASE    the base image. Default: python:3.12-slim when it is already in local storage, else
#           localhost/llmrs-base:bookworm, which this script makes where no registry is reachable:
#           mmdebstrap --variant=minbase (python3, python3-venv) into build/container/rootfs.tar
#           (kept as a cache), then podman import.
#   PY      the host Python that builds the wheelhouse (default .venv/bin/python)
#
# The wheelhouse (build/wheelhouse, never committed) is built on the host for the base's Python,
# so the image installs with pip --no-index. Docker is used when its daemon answers; else buildah
# (bud --isolation chroot). Missing Debian packages are installed when run as root.
set -euo pipefail
cd "$(dirname "$0")/.."
IMAGE=${IMAGE:-localhost/llmrs:latest}
TARGET=${TARGET:-baked}
PY=${PY:-.venv/bin/python}
LOCAL_BASE=localhost/llmrs-base:bookworm
start=$(date +%s)

if command -v docker > /dev/null && docker info > /dev/null 2>&1; then
  builder=docker
else
  builder=buildah
  deploy/need.sh buildah:buildah podman:podman
fi
has_image() {
  if [ $builder = docker ]; then docker image inspect "$1" > /dev/null 2>&1
  else buildah inspect --type image "$1" > /dev/null 2>&1; fi
}

if [ -z "${BASE:-}" ]; then
  if has_image python:3.12-slim || has_image docker.io/library/python:3.12-slim; then
    BASE=python:3.12-slim
  else
    BASE=$LOCAL_BASE
  fi
fi
if [ "$BASE" = $LOCAL_BASE ]; then
  IMAGE_PYTHON=3.11  # Debian bookworm's python3
  if ! has_image $LOCAL_BASE; then
    if [ ! -s build/container/rootfs.tar ]; then
      deploy/need.sh mmdebstrap:mmdebstrap
      echo "making the base root filesystem (mmdebstrap bookworm, about 2 minutes) ..."
      mkdir -p build/container
      mmdebstrap --quiet --variant=minbase --include=python3,python3-venv bookworm build/container/rootfs.tar.partial
      mv build/container/rootfs.tar.partial build/container/rootfs.tar
    fi
    if [ $builder = docker ]; then docker import build/container/rootfs.tar $LOCAL_BASE > /dev/null
    else podman import build/container/rootfs.tar $LOCAL_BASE > /dev/null; fi
    echo "base image: $LOCAL_BASE (from build/container/rootfs.tar)"
  fi
else
  # python:3.12-slim and the like: the Python version is in the tag; else say it with IMAGE_PYTHON
  IMAGE_PYTHON=${IMAGE_PYTHON:-$(echo "$BASE" | sed -n 's/.*python:\([0-9]*\.[0-9]*\).*/\1/p')}
  [ -n "$IMAGE_PYTHON" ] || { echo "BASE=$BASE: set IMAGE_PYTHON to its Python version (3.11, say)" >&2; exit 1; }
fi

if [ "$TARGET" = baked ] && [ ! -s models/SmolLM2-135M-Instruct.Q4_1.gguf ]; then
  echo "the baked image needs models/SmolLM2-135M-Instruct.Q4_1.gguf: run make fetch, or TARGET=runtime" >&2
  exit 1
fi
rm -rf build/wheelhouse
IMAGE_PYTHON=$IMAGE_PYTHON deploy/wheelhouse.sh "$PY"

echo "building $IMAGE (target $TARGET, base $BASE, with $builder) ..."
if [ $builder = docker ]; then
  docker build -f deploy/Dockerfile --target "$TARGET" --build-arg BASE="$BASE" -t "$IMAGE" .
else
  buildah bud --isolation chroot --format docker --layers --pull=never --quiet -f deploy/Dockerfile \
    --target "$TARGET" --build-arg BASE="$BASE" -t "$IMAGE" . > /dev/null
fi
echo "make container: built $IMAGE in $(( $(date +%s) - start )) s"
