#!/usr/bin/env bash
# `make demo` from nothing cached, without touching this machine's caches: a fresh clone of this
# repository with its own project cache, Go module and build caches, uv and pip caches and podman
# storage, all under $COLD (default /tmp/cold, removed first and left for inspection). Debian's
# packages (podman, buildah, ...) are taken as installed. Prints the total at the end; the
# demo's own log says where the time went. Needs about 25 GB free under $COLD.
# Usage: bench/cold_demo.sh [COLD]
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
C=${1:-/tmp/cold}
rm -rf "$C" && mkdir -p "$C"/{cache,gomod,gobuild,uv,pip,storage,run}
cat > "$C/storage.conf" <<EOC
[storage]
driver = "overlay"
graphroot = "$C/storage"
runroot = "$C/run"
EOC
export CONTAINERS_STORAGE_CONF=$C/storage.conf GOMODCACHE=$C/gomod GOCACHE=$C/gobuild \
  UV_CACHE_DIR=$C/uv PIP_CACHE_DIR=$C/pip
git clone -q "$repo" "$C/src"
cd "$C/src"
git log --oneline -1
start=$(date +%s)
make demo CACHE="$C/cache"
echo "cold make demo took $(( $(date +%s) - start ))s"
echo "to remove it: CONTAINERS_STORAGE_CONF=$C/storage.conf podman system reset -f && rm -rf $C"
