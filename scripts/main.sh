#!/usr/bin/env bash
# The main job on a fresh machine: fetch the model, start the whole system
# on loopback (verifier, drafter and gateway as separate processes talking
# gRPC), send one chat request through the gateway, print the text and its
# speculation stats, stop everything.
# Usage: scripts/main.sh ["your prompt"]
#   SPECMESH_MODEL=qwen2.5-coder-1.5b scripts/main.sh   # another catalog model
set -euo pipefail
cd "$(dirname "$0")/.."

cargo build --release --locked --workspace --bins
# A catalog name (fetched if needed) or a path; default smollm2-135m.
MODEL="${SPECMESH_MODEL:-smollm2-135m}"
if [ ! -e "$MODEL" ]; then
    MODEL="$(./target/release/specmesh model fetch "$MODEL" | tail -n1)"
fi

out="$(mktemp)"
SPECMESH_LOG="${SPECMESH_LOG:-warn}" ./target/release/specmesh up --model "$MODEL" --listen 127.0.0.1:0 >"$out" &
up=$!
trap 'kill "$up" 2>/dev/null; wait "$up" 2>/dev/null; rm -f "$out"' EXIT
addr=""
for _ in $(seq 1 600); do
    addr="$(sed -n 's/^specmesh up: gateway listening on //p' "$out")"
    [ -n "$addr" ] && break
    kill -0 "$up" 2>/dev/null || { cat "$out"; echo "specmesh up failed" >&2; exit 1; }
    sleep 0.2
done
[ -n "$addr" ] || { echo "the services did not start" >&2; exit 1; }
cat "$out"
./target/release/specmesh generate --gateway "http://$addr" --chat --max-new-tokens 128 \
    "${1:-Summarize in two sentences: The printing press, invented by Johannes Gutenberg around 1440, made books cheap to produce. Before it, books were copied by hand, so they were rare and expensive. Within decades, printed books spread across Europe, literacy rose, and new ideas travelled faster than ever before.}"
