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
# `deploy/build.sh rootfs` only checks (or makes) the cached root filesystem and stops: no builder,
# no image (what tests/core/test_deploy_files.py runs, with a stand-in mmdebstrap).
#
# The wheelhouse (build/wheelhouse, never committed) is built on the host for the base's Python,
# so the image installs with pip --no-index. Docker is used when its daemon answers; else buildah
# (bud --isolation chroot). Missing Debian packages are installed when run as root.
set -euo pipefail
cd "$(dirname "$0")/.."
MODE=${1:-image}
case "$MODE" in image | rootfs) ;; *) echo "usage: deploy/build.sh [image|rootfs]" >&2; exit 2 ;; esac
IMAGE=${IMAGE:-localhost/llmrs:latest}
TARGET=${TARGET:-baked}
PY=${PY:-.venv/bin/python}
LOCAL_BASE=localhost/llmrs-base:bookworm
ROOTFS=build/container/rootfs.tar
start=$(date +%s)

# Why the cache is not usable, or nothing when it is: a regular, non-empty file that tar lists to its
# end (a truncated tar fails with "Unexpected EOF") and that holds python3. A cache can be damaged:
# an mmdebstrap killed half-way, a full disk, or (before --format=tar below) a directory named
# rootfs.tar, which `podman import` refuses with "is a directory".
rootfs_problem() {
  if [ -L "$ROOTFS" ]; then echo "a symbolic link"
  elif [ -d "$ROOTFS" ]; then echo "a directory"
  elif [ ! -e "$ROOTFS" ]; then echo "missing"
  elif [ ! -f "$ROOTFS" ]; then echo "not a regular file"
  elif [ ! -s "$ROOTFS" ]; then echo "empty"
  else
    local listing
    # the listing goes to a variable, not a pipe: grep -q would stop reading early and tar's
    # SIGPIPE would fail the pipeline (pipefail) on a good tar
    listing=$(tar -tf "$ROOTFS" 2> /dev/null) || { echo "not a complete tar"; return; }
    grep -Eqx '(\./)?usr/bin/python3' <<< "$listing" || echo "a tar without usr/bin/python3"
  fi
}

# Make sure $ROOTFS is a usable Debian bookworm root filesystem tar: keep a good cache, re-create a
# damaged one (saying so on stderr) instead of failing on it later.
ensure_rootfs() {
  local problem t0
  problem=$(rootfs_problem)
  [ -z "$problem" ] && return 0
  if [ "$problem" != missing ]; then
    echo "$ROOTFS is $problem, not a usable root filesystem tar: making it again" >&2
    rm -rf "$ROOTFS"
  fi
  deploy/need.sh mmdebstrap:mmdebstrap
  echo "making the base root filesystem (mmdebstrap bookworm, about 2 minutes) ..."
  mkdir -p build/container
  rm -rf "$ROOTFS.partial"  # a leftover of an interrupted run (once a directory) would stop mmdebstrap
  t0=$(date +%s)
  # --format=tar: mmdebstrap infers the format from the target's name when not told, and a name
  # ending in .partial is not a tar name, so it wrote a directory (the mv then called it rootfs.tar).
  # Writing to .partial and renaming keeps an interrupted run from leaving a half tar behind.
  mmdebstrap --quiet --format=tar --variant=minbase --include=python3,python3-venv bookworm "$ROOTFS.partial"
  mv "$ROOTFS.partial" "$ROOTFS"
  problem=$(rootfs_problem)
  if [ -n "$problem" ]; then echo "mmdebstrap made $ROOTFS, but it is $problem" >&2; exit 1; fi
  echo "base root filesystem: $ROOTFS ($(du -h "$ROOTFS" | cut -f1)) made in $(( $(date +%s) - t0 )) s"
}

if [ "$MODE" = rootfs ]; then
  ensure_rootfs
  exit 0
fi

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
    ensure_rootfs
    step=$(date +%s)
    if [ $builder = docker ]; then docker import "$ROOTFS" $LOCAL_BASE > /dev/null
    else podman import --quiet "$ROOTFS" $LOCAL_BASE > /dev/null; fi  # --quiet: no copy progress on stderr
    echo "base image: $LOCAL_BASE (from $ROOTFS) imported in $(( $(date +%s) - step )) s"
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
step=$(date +%s)  # each step's wall time is printed: where the minutes go on a fresh machine
IMAGE_PYTHON=$IMAGE_PYTHON deploy/wheelhouse.sh "$PY"
echo "wheelhouse: built in $(( $(date +%s) - step )) s"
step=$(date +%s)

echo "building $IMAGE (target $TARGET, base $BASE, with $builder) ..."
if [ $builder = docker ]; then
  docker build -f deploy/Dockerfile --target "$TARGET" --build-arg BASE="$BASE" -t "$IMAGE" .
else
  buildah bud --isolation chroot --format docker --layers --pull=never --quiet -f deploy/Dockerfile \
    --target "$TARGET" --build-arg BASE="$BASE" -t "$IMAGE" . > /dev/null
fi
echo "make container: built $IMAGE in $(( $(date +%s) - start )) s (the image build $(( $(date +%s) - step )) s)"
