#!/usr/bin/env bash
# Regenerates the token rankings that ship in crates/draft-model/rankings/
# (the drafter's default for `--draft-head-tokens`): each model's greedy
# answers to tools/ranking/prompts.txt, plus the project's own documents.
# Run from the repository root after `cargo build --release` and
# `specmesh model fetch smollm2-135m qwen2.5-coder-0.5b`.
set -euo pipefail
bin=./target/release/specmesh
texts=(--text README.md)
for f in docs/*.md; do texts+=(--text "$f"); done
"$bin" token-ranking --model qwen2.5-coder-0.5b --max-new-tokens 512 "${texts[@]}" \
    --out crates/draft-model/rankings/qwen2.5.txt
"$bin" token-ranking --model smollm2-135m --max-new-tokens 512 "${texts[@]}" \
    --out crates/draft-model/rankings/smollm2.txt
