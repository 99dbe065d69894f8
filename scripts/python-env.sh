#!/usr/bin/env bash
# Creates (once) a Python environment the end-to-end tests use and prints
# its interpreter's path: by default the foreign clients' (gRPC, the
# `openai` package, the deployment linters: tests/python/requirements.txt);
# with `aiperf`, NVIDIA AIPerf's own (tests/python/aiperf-requirements.txt),
# kept apart because it pins much of the scientific Python stack.
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
    "") name=venv-grpc req=tests/python/requirements.txt ;;
    aiperf) name=venv-aiperf req=tests/python/aiperf-requirements.txt ;;
    *) echo "usage: $0 [aiperf]" >&2; exit 2 ;;
esac
venv="${SPECMESH_CACHE_DIR:-$HOME/.cache/specmesh}/$name"
stamp="$venv/.requirements"
if [ ! -x "$venv/bin/python" ] || ! cmp -s "$req" "$stamp"; then
    python3 -m venv "$venv" >&2
    "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$req" >&2
    cp "$req" "$stamp"
fi
echo "$venv/bin/python"
