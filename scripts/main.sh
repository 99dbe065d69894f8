#!/usr/bin/env bash
# The main job on a fresh machine: fetch the model, generate one chat answer
# with the real model, print the text and its stats.
# Usage: scripts/main.sh ["your prompt"]
set -euo pipefail
cd "$(dirname "$0")/.."

cargo build --release --locked -p specmesh-cli
MODEL="$(./target/release/specmesh model fetch | tail -n1)"
./target/release/specmesh generate --local --model "$MODEL" --chat --max-new-tokens 128 \
    "${1:-Write a short poem about the sea.}"
