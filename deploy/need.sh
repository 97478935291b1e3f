#!/usr/bin/env bash
# deploy/need.sh BINARY[:DEBIAN_PACKAGE] ...: make sure each binary is on PATH. As root on a Debian
# machine the missing packages are installed with apt-get; anyone else is told what to install.
set -euo pipefail
missing=()
for want in "$@"; do
  bin=${want%%:*}; pkg=${want#*:}
  command -v "$bin" > /dev/null || missing+=("$pkg")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get > /dev/null; then
  echo "installing ${missing[*]} (apt-get) ..."
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q "${missing[@]}" > /dev/null 2>&1 || { apt-get update -q > /dev/null && apt-get install -y -q "${missing[@]}" > /dev/null; }
else
  echo "missing: ${missing[*]}. Install them: sudo apt-get install -y ${missing[*]} (Debian/Ubuntu)" >&2
  exit 1
fi
