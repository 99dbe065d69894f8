#!/usr/bin/env python3
"""Speedup against the drafter link's round trip: measured, and predicted.

Reads the `specmesh bench --json` files of one configuration run at several
added round trips (`--drafter-rtt-ms`), each interleaved with `off` on the
same questions, and prints for each round trip the measured speedup (as the
bench reports it: tokens over wall time, prefill included), the tree wait
and milliseconds per verify step, tokens per step, the share of steps
drafted ahead, and what the model of docs/lab/separate-host.md (the
round-trip model) predicts from the lowest round trip's run alone:

    wall(r) = wall(r0) + steps(r0) * (r - r0)
    S(r)    = wall_off(r0) / wall(r)

that is: every verify step waits one more round trip for its tree and
nothing else changes. (A step whose empty tree was sent ahead waits for
nothing, and the policy drafts less as the link slows; the first makes the
prediction pessimistic, the second can go either way.)

    python3 tools/bench/rtt_model.py CONFIG RTT_MS=FILE.json [RTT_MS=FILE.json ...]
"""

import json
import sys


def load(path, config):
    with open(path) as f:
        report = json.load(f)
    runs = [r for r in report["runs"] if r["config"] == config]
    off = [r for r in report["runs"] if r["config"] == "off"]
    if not runs or not off:
        sys.exit(f"{path}: no `{config}` or no `off` runs")
    return runs, off


def point(runs, off):
    steps = sum(r["verify_steps"] for r in runs)
    accepted = sum(r["accepted_tokens"] for r in runs)
    wall = sum(r["wall_seconds"] for r in runs)
    wall_off = sum(r["wall_seconds"] for r in off)
    return {
        "wall": wall,
        "wall_off": wall_off,
        "steps": steps,
        "tau": (steps + accepted) / steps,
        "ms_per_step": sum(r["decode_seconds"] for r in runs) / steps * 1e3,
        "wait_ms": sum(r["tree_wait_seconds"] for r in runs) / steps * 1e3,
        "ahead": sum(r["drafted_ahead_steps"] for r in runs) / steps,
        "speedup": wall_off / wall,
    }


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    config = sys.argv[1]
    points = []
    for arg in sys.argv[2:]:
        rtt, path = arg.split("=", 1)
        points.append((float(rtt), point(*load(path, config))))
    points.sort(key=lambda p: p[0])
    r0, base = points[0]
    print(f"config {config}; predicted from the {r0:g} ms run "
          f"({base['steps']} steps, tau {base['tau']:.2f}, "
          f"{base['ms_per_step']:.1f} ms per step of which {base['wait_ms']:.1f} waiting for trees)")
    print("| added RTT | tokens/step | ms/step | tree wait/step | drafted ahead | measured | predicted |")
    print("|---|---|---|---|---|---|---|")
    for rtt, p in points:
        wall = base["wall"] + base["steps"] * (rtt - r0) / 1e3
        predicted = base["wall_off"] / wall
        print(f"| {rtt:g} ms | {p['tau']:.2f} | {p['ms_per_step']:.1f} | {p['wait_ms']:.1f} ms | "
              f"{p['ahead'] * 100:.0f}% | {p['speedup']:.2f}x | {predicted:.2f}x |")


if __name__ == "__main__":
    main()
