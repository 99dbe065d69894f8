#!/usr/bin/env bash
# The long chaos run, outside CI: two verifiers and two drafters killed
# (kill -9) at random and restarted while streamed load runs, for at least
# SPECMESH_CHAOS_MINUTES minutes (default 10) and SPECMESH_CHAOS_KILLS
# kills (default 50), whichever ends later. SPECMESH_CHAOS_SEED (default 7)
# seeds the victims and delays. The last line it prints is the summary:
# requests, kills, lost, changed, added latency per faulted request and
# the stall each kill caused (p50/p99); it fails if anything was lost or
# changed, or a verifier holds sessions or KV afterwards.
set -euo pipefail
cd "$(dirname "$0")/../.."
export SPECMESH_CHAOS_MINUTES="${SPECMESH_CHAOS_MINUTES:-10}"
export SPECMESH_CHAOS_KILLS="${SPECMESH_CHAOS_KILLS:-50}"
export SPECMESH_CHAOS_SEED="${SPECMESH_CHAOS_SEED:-7}"
# The test runs the release binaries, which cargo does not build for it.
cargo build --release --locked --workspace --bins
if [[ -z "${SPECMESH_MODEL:-}" ]]; then
    SPECMESH_MODEL="$(./target/release/specmesh model fetch | tail -n1)"
    export SPECMESH_MODEL
fi
log="$(mktemp -t specmesh-chaos.XXXXXX)"
status=0
cargo test --release --locked -p specmesh-e2e --test chaos -- \
    --ignored --exact chaos_for_minutes --nocapture 2>&1 | tee "$log" || status=$?
echo "full log: $log"
grep '^chaos summary:' "$log" | tail -n1 || echo "no summary: the run failed before it ended"
exit "$status"
