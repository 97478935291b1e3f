#!/usr/bin/env bash
# Build the image's wheelhouse on the host: the project's wheel and the wheels of its runtime and
# `serve` dependencies, for the image's Python (IMAGE_PYTHON, default 3.11: Debian bookworm's) and
# this machine's architecture, into build/wheelhouse (never committed). The image then installs from
# it with `pip install --no-index`: its build needs no network.
#   usage: deploy/wheelhouse.sh [PYTHON]      (PYTHON: the host interpreter with pip; default .venv/bin/python)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${1:-.venv/bin/python}
IMAGE_PYTHON=${IMAGE_PYTHON:-3.11}
OUT=build/wheelhouse
mkdir -p "$OUT"
# the project's requirements (dependencies + the serve extra), read from pyproject.toml, minus itself
"$PY" - > build/image-requirements.txt <<'PYEOF'
import re, sys
try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
for req in project["dependencies"] + project["optional-dependencies"]["serve"]:
    if not re.match(r"llmrs-core\b", req):
        print(req)
PYEOF
rm -f "$OUT"/llmrs_core-*.whl
"$PY" -m pip wheel -q --no-deps -w "$OUT" .
arch=$(uname -m)
platforms=()
for tag in manylinux1 manylinux2010 manylinux2014 manylinux_2_17 manylinux_2_24 manylinux_2_27 manylinux_2_28 \
           manylinux_2_31 manylinux_2_34 manylinux_2_35 manylinux_2_36; do
  platforms+=(--platform "${tag}_${arch}")
done
"$PY" -m pip download -q --only-binary=:all: --python-version "$IMAGE_PYTHON" --implementation cp \
  "${platforms[@]}" -d "$OUT" -r build/image-requirements.txt 2> >(grep -v "^WARNING: Location" >&2)
echo "wheelhouse: $(ls "$OUT" | wc -l) wheels in $OUT for Python $IMAGE_PYTHON ($arch), $(du -sh "$OUT" | cut -f1)"
