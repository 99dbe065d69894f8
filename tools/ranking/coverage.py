#!/usr/bin/env python3
"""How much of Spec-Bench's prompt text a frequent-token draft head keeps.

For each category's first question (first turn), and for 40 questions drawn
with seed 1, prints the share of its tokens (the Qwen2.5 tokenizer, through
`specmesh tokenize`) inside the N tokens the drafter keeps with
`--draft-head-tokens N`: the shipped ranking first, then unseen ids in
increasing order (`TokenRanking::top`), beside plain id order.

    tools/ranking/coverage.py ../shared/bench/spec_bench_dev.jsonl
"""
import json
import random
import subprocess
import sys

SIZES = (4096, 8192, 16384, 32768, 65536)


def ids(text):
    out = subprocess.run(
        ["./target/release/specmesh", "tokenize", "--model", "qwen2.5-coder-1.5b", "--json", text],
        capture_output=True, text=True, check=True).stdout
    return json.loads(out)["ids"]


def head(ranked, n):
    keep = set(ranked[:n])
    i = 0
    while len(keep) < n:
        keep.add(i)
        i += 1
    return keep


def main():
    ranked = [int(l.split()[0]) for l in open("crates/draft-model/rankings/qwen2.5.txt") if l[0].isdigit()]
    questions = [json.loads(l) for l in open(sys.argv[1])]
    heads = {n: head(ranked, n) for n in SIZES[:4]}
    first = {}
    for q in questions:
        first.setdefault(q["category"], q)
    for cat, q in first.items():
        t = ids(q["turns"][0])
        print(f"{cat:16} {len(t):5} " + " ".join(
            f"{n}:{sum(i in s for i in t) / len(t):.2f}" for n, s in heads.items()))
    random.seed(1)
    sample = [tok for q in random.sample(questions, 40) for tok in ids(q["turns"][0][:3000])]
    print(f"40 questions, {len(sample)} tokens")
    for n in SIZES:
        by_id = sum(i < n for i in sample) / len(sample)
        kept = head(ranked, n)
        ranking = sum(i in kept for i in sample) / len(sample)
        print(f"  {n:6}: id order {by_id:.3f}, ranking then ids {ranking:.3f}")


if __name__ == "__main__":
    main()
