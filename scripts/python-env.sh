#!/usr/bin/env bash
# Creates (once) the Python environment the end-to-end tests use as a
# foreign gRPC client, and prints its interpreter's path.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${SPECMESH_CACHE_DIR:-$HOME/.cache/specmesh}/venv-grpc"
req=tests/python/requirements.txt
stamp="$venv/.requirements"
if [ ! -x "$venv/bin/python" ] || ! cmp -s "$req" "$stamp"; then
    python3 -m venv "$venv" >&2
    "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$req" >&2
    cp "$req" "$stamp"
fi
echo "$venv/bin/python"
