#!/usr/bin/env bash
# The replicated cluster's throughput next to a single memory-store server
# in the same run (docs/benchmarks.md, "The replicated cluster").
#
# Starts a single `tollgate serve` (memory store) and a cluster of NODES
# `tollgate serve --cluster` on loopback, all with the same config: one
# token bucket per strategy (counter, queue with frequency analysis,
# epoch). Then, ROUNDS times, interleaved, `tollgate bench --api native`
# against the single server and against node 1 of the cluster, for each
# strategy. After each cluster run it reads node 1's /metrics and prints
# gossip bytes and datagrams sent per decision.
#
# Usage: scripts/bench-cluster.sh [ROUNDS] [SECONDS]
# Environment: TOLLGATE (the binary; default: built here in release),
# NODES (default 3), KEYS (distinct users, default 100000), CLIENTS (in
# flight, default 128).
set -euo pipefail

ROUNDS=${1:-3}
SECONDS_PER_RUN=${2:-5}
NODES=${NODES:-3}
KEYS=${KEYS:-100000}
CLIENTS=${CLIENTS:-128}
cd "$(dirname "$0")/.."

if [[ -z "${TOLLGATE:-}" ]]; then
    cargo build --release --locked -p tollgate >&2
    TOLLGATE="${CARGO_TARGET_DIR:-target}/release/tollgate"
fi

work=$(mktemp -d)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    rm -rf "$work"
}
trap cleanup EXIT

cat >"$work/tollgate.yaml" <<'EOF'
namespaces:
  - name: default
    resources:
      - { name: counter, algorithm: token_bucket, capacity: 100, rate: 10/s, replication: counter }
      - { name: queue,   algorithm: token_bucket, capacity: 100, rate: 10/s, replication: queue }
      - { name: epoch,   algorithm: token_bucket, capacity: 100, rate: 10/s, replication: epoch }
EOF
head -c 32 /dev/urandom | base64 >"$work/secret"

free_udp() {
    python3 -c 'import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
wait_for() { until grep -qs 'grpc=' "$1"; do sleep 0.1; done; }
addr_of() { grep -o "$2=[0-9.:]*" "$1" | head -1 | cut -d= -f2; }

"$TOLLGATE" serve --grpc 127.0.0.1:0 --http 127.0.0.1:0 --config "$work/tollgate.yaml" \
    2>"$work/single.log" &
pids+=($!)
SINGLE_PID=$!
wait_for "$work/single.log"
SINGLE=$(addr_of "$work/single.log" grpc)

gossip=()
for ((i = 1; i <= NODES; i++)); do gossip+=("127.0.0.1:$(free_udp)"); done
peers=$(IFS=,; echo "${gossip[*]}")
for ((i = 1; i <= NODES; i++)); do
    "$TOLLGATE" serve --grpc 127.0.0.1:0 --http 127.0.0.1:0 --config "$work/tollgate.yaml" \
        --cluster bench --node-id "n$i" --gossip "${gossip[$((i - 1))]}" --peers "$peers" \
        --cluster-secret-file "$work/secret" 2>"$work/node$i.log" &
    pids+=($!)
    [[ $i == 1 ]] && NODE1_PID=$!
done
for ((i = 1; i <= NODES; i++)); do wait_for "$work/node$i.log"; done
NODE1=$(addr_of "$work/node1.log" grpc)
NODE1_HTTP=$(addr_of "$work/node1.log" http)
until curl -sf "http://$NODE1_HTTP/readyz" >/dev/null; do sleep 0.1; done

metric() {
    curl -s "http://$NODE1_HTTP/metrics" | awk -v m="$1" '$1 ~ "^"m"(\\{|$)" { s += $2 } END { print s + 0 }'
}
run() {
    "$TOLLGATE" bench --target "$1" --api native --resource "$2" --concurrency "$CLIENTS" \
        --keys "$KEYS" --warmup 1s --duration "${SECONDS_PER_RUN}s" --server-pid "$3" --json
}
summary() {
    python3 -c '
import json, sys
r = json.load(sys.stdin)
cpu = (r.get("server_cpu") or {}).get("us_per_request", 0)
t, p50, p99 = r["throughput"], r["latency_us"]["p50"], r["latency_us"]["p99"]
print(f"{t:.0f} req/s, p50 {p50:.0f} us, p99 {p99:.0f} us, server {cpu:.1f} us CPU/req")
'
}

for ((round = 1; round <= ROUNDS; round++)); do
    for strategy in counter queue epoch; do
        echo "round $round, $strategy, single server: $(run "$SINGLE" "$strategy" "$SINGLE_PID" | summary)"
        bytes0=$(metric tollgate_gossip_bytes_sent_total)
        msgs0=$(metric tollgate_gossip_messages_sent_total)
        out=$(run "$NODE1" "$strategy" "$NODE1_PID")
        bytes1=$(metric tollgate_gossip_bytes_sent_total)
        msgs1=$(metric tollgate_gossip_messages_sent_total)
        requests=$(echo "$out" | python3 -c 'import json,sys; print(json.load(sys.stdin)["requests"])')
        echo "round $round, $strategy, cluster node 1: $(echo "$out" | summary); gossip $(python3 -c "print(f'{($bytes1 - $bytes0) / max($requests, 1):.1f} bytes, {($msgs1 - $msgs0) / max($requests, 1):.3f} datagrams')") sent per decision"
    done
done
