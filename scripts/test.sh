#!/usr/bin/env bash
# The whole test suite, on a fresh machine: builds, installs what the tests
# need (the model, via `specmesh model fetch`), then runs every test against
# the real model. Extra arguments go to `cargo test`.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo build --release --locked -p specmesh-cli
SPECMESH_MODEL="$(./target/release/specmesh model fetch | tail -n1)"
export SPECMESH_MODEL
echo "model: $SPECMESH_MODEL"

cargo test --release --locked --workspace "$@"
