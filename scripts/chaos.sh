#!/usr/bin/env bash
# Runs the fault-injection suite (crates/tollgate/tests/chaos.rs,
# docs/reliability.md) over many seeds and prints a summary: schedules run,
# faults injected by kind, invariant violations, and the largest memory
# seen against its bound.
#
#   scripts/chaos.sh SEEDS [FAMILIES]
#
# SEEDS: `1-200`, `3,17,40`, or both (`1-50,99`). FAMILIES: a comma-separated
# subset of `redis,cluster,gossip` (default: all three). Each family runs
# every seed, one schedule after the other, on fresh processes.
# Exit status 1 when any schedule broke an invariant; the failing seeds and
# their steps are printed by the test, and the command to replay one.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ $# -lt 1 ] || [ $# -gt 2 ]; then
    echo "usage: scripts/chaos.sh SEEDS [FAMILIES]   e.g. scripts/chaos.sh 1-200 redis,gossip" >&2
    exit 2
fi
seeds=$1
families=${2:-redis,cluster,gossip}

report=$(mktemp "${TMPDIR:-/tmp}/tollgate-chaos.XXXXXX.jsonl")
log=${report%.jsonl}.log
echo "== chaos: seeds $seeds, families $families"
echo "   one JSON line per schedule in $report; test output in $log"

# `cargo test` builds the binary the test runs (with the features its
# tests use), so no separate `cargo build`.
status=0
TOLLGATE_CHAOS_SEEDS=$seeds TOLLGATE_CHAOS_FAMILIES=$families TOLLGATE_CHAOS_REPORT=$report \
    cargo test -p tollgate --locked --test chaos -- --test-threads 1 --nocapture >"$log" 2>&1 ||
    status=$?

# The summary, from the report's JSON lines (jq is installed with the
# project's tools; see scripts/test.sh).
if ! command -v jq >/dev/null 2>&1; then
    echo "jq is needed for the summary; the report is $report" >&2
    exit "$status"
fi
if [ ! -s "$report" ]; then
    echo "no schedule ran; see $log" >&2
    tail -n 40 "$log" >&2
    exit 1
fi
jq -rs '
  "schedules run:        \(length) (" + (group_by(.family) | map("\(.[0].family) \(length)") | join(", ")) + ")",
  "steps played:         \(map(.steps) | add)",
  "faults injected:      \(map(.faults | to_entries | map(.value) | add // 0) | add)",
  (map(.faults | to_entries[]) | group_by(.key) | map("  \(.[0].key): \(map(.value) | add)") | .[]),
  "invariant violations: \(map(.violations | length) | add)",
  (map(.violations[]) | group_by(.kind) | map("  \(.[0].kind): \(length)") | .[]),
  (group_by(.family) | map(select(map(.violations | length) | add > 0) | "  failing \(.[0].family) seeds: \(map(select(.violations | length > 0) | .seed) | map(tostring) | join(","))") | .[]),
  "largest memory seen against its bound:",
  (map(.memory[]) | group_by(.what) | map("  \(.[0].what): \(map(.max) | max) of \(map(.bound) | max)") | .[])
' "$report"
if [ "$status" != 0 ]; then
    echo "== some schedules failed: the violations and steps are in $log"
fi
exit "$status"
