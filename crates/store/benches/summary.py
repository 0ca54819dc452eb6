#!/usr/bin/env python3
"""Tables for docs/benchmarks.md from criterion's output of `--bench decide`.

    python3 crates/store/benches/summary.py "$CARGO_TARGET_DIR/criterion"

Reads every `<bench>/new/estimates.json` under the given criterion directory
and prints two markdown tables: the per-algorithm decision cost, and
tollgate against governor with the ratios. Each figure is criterion's
point estimate (the slope of time against iterations, or the mean when
there is no slope), in nanoseconds per decision.
"""

import json
import os
import sys


def estimates(root):
    """{full_id: ns} for every benchmark under `root`."""
    out = {}
    for dirpath, _dirs, files in os.walk(root):
        if os.path.basename(dirpath) != "new" or "estimates.json" not in files:
            continue
        with open(os.path.join(dirpath, "benchmark.json")) as f:
            full_id = json.load(f)["full_id"]
        with open(os.path.join(dirpath, "estimates.json")) as f:
            est = json.load(f)
        pick = est.get("slope") or est["mean"]
        out[full_id] = pick["point_estimate"]
    return out


def ns(v):
    if v is None:
        return "–"
    return f"{v:.0f}" if v >= 100 else f"{v:.1f}"


def ratio(a, b):
    if a is None or b is None:
        return "–"
    return f"{a / b:.2f}"


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "target/criterion"
    e = estimates(root)

    algos = []
    for k in e:
        parts = k.split("/")
        if parts[0] == "algorithm" and parts[2] not in algos:
            algos.append(parts[2])
    if algos:
        print("| algorithm | hot key (ns) | 1M keys (ns) |")
        print("|---|---:|---:|")
        for a in algos:
            hot = e.get(f"algorithm/hot/{a}")
            many = e.get(f"algorithm/1M/{a}")
            print(f"| {a} | {ns(hot)} | {ns(many)} |")
        print()

    cases = []
    for k in e:
        parts = k.split("/")
        if parts[0] == "vs_governor" and parts[1] not in cases:
            cases.append(parts[1])
    if cases:
        print(
            "| scenario | tollgate | governor (String) | governor (u64) "
            "| tollgate ÷ governor (String) | tollgate ÷ governor (u64) |"
        )
        print("|---|---:|---:|---:|---:|---:|")
        for c in cases:
            t = e.get(f"vs_governor/{c}/tollgate")
            gs = e.get(f"vs_governor/{c}/governor-string")
            gu = e.get(f"vs_governor/{c}/governor-u64")
            print(
                f"| {c} | {ns(t)} | {ns(gs)} | {ns(gu)} "
                f"| {ratio(t, gs)} | {ratio(t, gu)} |"
            )
        extra = [k for k in e if k.endswith("/tollgate-systime")]
        if extra:
            print()
            print("| scenario | tollgate, SystemTime::now() clock (ns) |")
            print("|---|---:|")
            for k in extra:
                print(f"| {k.split('/')[1]} | {ns(e[k])} |")


if __name__ == "__main__":
    main()
