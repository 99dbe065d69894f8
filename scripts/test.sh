#!/usr/bin/env bash
# The whole test suite, on a fresh machine: builds every binary, installs
# what the tests need (the model via `specmesh model fetch`, a Python gRPC
# client for the reflection test), then runs every test against the real
# model and the real services. Extra arguments go to `cargo test`.
set -euo pipefail
cd "$(dirname "$0")/.."

# The end-to-end tests start the service binaries as processes: cargo only
# builds a package's binaries for that package's own tests, so build all.
cargo build --release --locked --workspace --bins
SPECMESH_MODEL="$(./target/release/specmesh model fetch | tail -n1)"
export SPECMESH_MODEL
SPECMESH_TEST_PYTHON="$(scripts/python-env.sh)"
export SPECMESH_TEST_PYTHON
echo "model: $SPECMESH_MODEL"

log="$(mktemp)"
trap 'rm -f "$log"' EXIT
cargo test --release --locked --workspace "$@" 2>&1 | tee "$log"
# One closing line for the whole run (cargo prints one per test binary, the
# last ones being empty doc-test runs).
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($i == "passed;") p += $(i-1); if ($i == "failed;") f += $(i-1) } }
     END { printf "tests: %d passed, %d failed\n", p, f }' "$log"
