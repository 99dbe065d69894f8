#!/usr/bin/env python3
"""Where a verifier's step time went, from two scrapes of its /metrics.

    step_breakdown.py BEFORE.txt AFTER.txt      # two saved scrapes
    step_breakdown.py --url URL -- COMMAND...   # scrape, run COMMAND, scrape

Prints, for each phase of `specmesh_verify_phase_seconds`, how often it
ran, its mean, and its time per batched forward; then the planner's
counters (tokens per forward, nodes proposed / granted, expected and actual
accepted drafted tokens) and the trees the batch did not wait for.
Per-session phases (tree_wait, validate, queue, report) overlap across
the sessions of a batch, so only the per-forward phases (plan, forward,
verify, commit, gap) add up to a step's wall time.
"""
import re
import subprocess
import sys
import urllib.request

SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$')
PER_SESSION = ["tree_wait", "validate", "queue", "report"]
PER_FORWARD = ["plan", "forward", "verify", "commit", "gap"]


def parse(text):
    out = {}
    for line in text.splitlines():
        m = SAMPLE.match(line.strip())
        if not m or line.startswith("#"):
            continue
        name, labels, value = m.group(1), m.group(2) or "", m.group(3)
        try:
            out[(name, labels)] = float(value)
        except ValueError:
            pass
    return out


def delta(a, b, name, labels=""):
    total = 0.0
    for (n, l), v in b.items():
        if n == name and labels in l:
            total += v - a.get((n, l), 0.0)
    return total


def report(a, b):
    forwards = delta(a, b, "specmesh_verify_phase_seconds_count", 'phase="forward"')
    print(f"batched forwards: {forwards:.0f}")
    print(f"{'phase':<10} {'count':>8} {'mean ms':>9} {'ms per forward':>15}")
    for phase in PER_FORWARD + PER_SESSION:
        sel = f'phase="{phase}"'
        n = delta(a, b, "specmesh_verify_phase_seconds_count", sel)
        s = delta(a, b, "specmesh_verify_phase_seconds_sum", sel)
        if n == 0:
            continue
        per = s / forwards * 1e3 if forwards else 0.0
        print(f"{phase:<10} {n:>8.0f} {s / n * 1e3:>9.3f} {per:>15.3f}")
    tokens = delta(a, b, "specmesh_verify_forward_tokens_sum")
    sessions = delta(a, b, "specmesh_verify_batch_size_sum")
    proposed = delta(a, b, "specmesh_planner_nodes_proposed_total")
    granted = delta(a, b, "specmesh_planner_nodes_granted_total")
    expected = delta(a, b, "specmesh_planner_expected_accepted_total")
    accepted = delta(a, b, "specmesh_planner_accepted_total")
    if forwards:
        print(f"sessions per forward {sessions / forwards:.2f}, tokens per forward {tokens / forwards:.2f}")
    print(f"nodes proposed {proposed:.0f}, granted {granted:.0f}; "
          f"accepted drafted tokens expected {expected:.1f}, actual {accepted:.0f}")
    others = delta(a, b, "specmesh_verify_trees_yielded_total", 'patience="others"')
    late = delta(a, b, "specmesh_verify_trees_yielded_total", 'patience="deadline"')
    print(f"trees not waited for: {others:.0f} (not paying, the others in), "
          f"{late:.0f} (the batch's wait ran out)")


def scrape(url):
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read().decode()


def main(argv):
    if argv[:1] == ["--url"]:
        url, rest = argv[1], argv[2:]
        if rest[:1] == ["--"]:
            rest = rest[1:]
        a = parse(scrape(url))
        subprocess.run(rest, check=True)
        b = parse(scrape(url))
    elif len(argv) == 2:
        a, b = (parse(open(p).read()) for p in argv)
    else:
        print(__doc__, file=sys.stderr)
        return 2
    report(a, b)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
