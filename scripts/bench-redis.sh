#!/usr/bin/env bash
# The Redis store's throughput next to the ceiling Redis itself sets, in
# the same run (docs/benchmarks.md, "The Redis store").
#
# Starts a redis-server of its own on a free loopback port and `tollgate
# serve --store redis://` on it, captures the exact EVALSHA the server
# sends for one native request (with MONITOR), then interleaves, ROUNDS
# times:
#   - redis-benchmark running that EVALSHA over the same keyspace (one key
#     per user, like the server), two ways: CLIENTS connections one request
#     each, and 8 connections pipelining 16 (the better is the ceiling);
#   - `tollgate bench --api native` against the server.
# Prints one line per run and the ratio per round. Failed decisions are
# counted in the last column and reported by kind, and make the script
# exit 1 after the last round.
#
# `scripts/bench-redis.sh hot [ROUNDS] [SECONDS]` measures instead a hot
# key that is over its limit (one user of the `default`/`api` token
# bucket, 32 in flight), through the native gRPC and the HTTP API: the
# memory store next to the Redis store, whose local over-limit cache
# answers such a key (docs/redis.md), interleaved, each server pinned to
# CPU 0 and the client to CPU 1 when there are two.
#
# Usage: scripts/bench-redis.sh [hot] [ROUNDS] [SECONDS]
# Environment: TOLLGATE (the binary; default: built here in release),
# KEYS (distinct users, default 100000), CLIENTS (in flight, default 128),
# SERVE_ARGS (more `tollgate serve` flags, e.g. --redis-connections 4).
set -euo pipefail

MODE=ceiling
if [[ "${1:-}" == hot ]]; then
    MODE=hot
    shift
fi
ROUNDS=${1:-3}
SECONDS_PER_RUN=${2:-5}
KEYS=${KEYS:-100000}
CLIENTS=${CLIENTS:-128}
cd "$(dirname "$0")/.."

if [[ -z "${TOLLGATE:-}" ]]; then
    cargo build --release --locked -p tollgate >&2
    TOLLGATE="${CARGO_TARGET_DIR:-target}/release/tollgate"
fi
for tool in redis-server redis-cli redis-benchmark; do
    command -v "$tool" >/dev/null || { echo "$tool is missing (apt-get install redis-server)" >&2; exit 2; }
done

work=$(mktemp -d)
cleanup() {
    [[ -n "${SERVE:-}" ]] && kill "$SERVE" 2>/dev/null || true
    [[ -n "${PORT:-}" ]] && redis-cli -p "$PORT" shutdown nosave >/dev/null 2>&1 || true
    rm -rf "$work"
}
trap cleanup EXIT

PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
redis-server --port "$PORT" --bind 127.0.0.1 --save '' --appendonly no \
    --dir "$work" --daemonize yes --logfile "$work/redis.log"
until redis-cli -p "$PORT" ping >/dev/null 2>&1; do sleep 0.1; done

if [[ $MODE == hot ]]; then
    pin_server=() pin_client=()
    if command -v taskset >/dev/null && (( $(nproc) >= 2 )); then
        pin_server=(taskset -c 0) pin_client=(taskset -c 1)
    fi
    # Reads `tollgate bench --json` and the server's metrics; prints
    # req/s, server CPU µs per request, cache hits and failed decisions.
    cat >"$work/hot.py" <<'EOF'
import json, sys, urllib.request
j = json.load(open(sys.argv[1]))
hits = 0
for line in urllib.request.urlopen(sys.argv[2]).read().decode().splitlines():
    if line.startswith("tollgate_store_rejection_cache_hits_total"):
        hits = int(float(line.split()[-1]))
if j["errors"]:
    print("tollgate bench: %d of %d decisions failed: %s"
          % (j["errors"], j["requests"], j.get("error_kinds")), file=sys.stderr)
print(round(j["throughput"]), (j.get("server_cpu") or {}).get("us_per_request", 0), hits,
      j["errors"])
EOF
    # One run: STORE API -> the line above.
    hot_run() {
        "${pin_server[@]}" "$TOLLGATE" serve --grpc 127.0.0.1:0 --http 127.0.0.1:0 \
            --config examples/ --store "$1" ${SERVE_ARGS:-} 2>"$work/serve.log" &
        SERVE=$!
        until grep -qs 'grpc=' "$work/serve.log"; do
            kill -0 "$SERVE" 2>/dev/null || { echo "tollgate serve --store $1 exited:" >&2; cat "$work/serve.log" >&2; exit 1; }
            sleep 0.1
        done
        local which=grpc
        [[ $2 == http ]] && which=http
        local target metrics
        target=$(grep -o "$which=[0-9.:]*" "$work/serve.log" | cut -d= -f2)
        metrics=$(grep -o 'http=[0-9.:]*' "$work/serve.log" | cut -d= -f2)
        "${pin_client[@]}" "$TOLLGATE" bench --target "$target" --api "$2" --concurrency 32 \
            --keys 1 --warmup 1s --duration "${SECONDS_PER_RUN}s" --server-pid "$SERVE" \
            --json >"$work/hot.json"
        sleep 0.6 # the store publishes its counters every half second
        python3 "$work/hot.py" "$work/hot.json" "http://$metrics/metrics"
        if ! kill "$SERVE" 2>/dev/null; then
            echo "tollgate serve --store $1 had exited:" >&2
            tail -5 "$work/serve.log" >&2
        fi
        wait "$SERVE" 2>/dev/null || true
        SERVE=
    }
    printf '%-6s %-7s %10s %10s %7s %10s %10s %7s %11s %7s\n' round api 'memory/s' 'redis/s' ratio \
        'memory µs' 'redis µs' 'µs ×' 'cache hits' errors
    failed=0
    for r in $(seq 1 "$ROUNDS"); do
        for api in native http; do
            # Not `read < <(hot_run ...)`: a process substitution runs on
            # in the background, and the next server would start before
            # this one stopped.
            hot_run memory "$api" >"$work/memory.txt"
            hot_run "redis://127.0.0.1:$PORT/" "$api" >"$work/redis.txt"
            read -r m ms _ me <"$work/memory.txt"
            read -r d ds hits de <"$work/redis.txt"
            (( me + de == 0 )) || failed=$(( failed + 1 ))
            printf '%-6s %-7s %10s %10s %7.2f %10s %10s %7.2f %11s %7s\n' "$r" "$api" "$m" "$d" \
                "$(python3 -c "print($d / $m)")" "$ms" "$ds" "$(python3 -c "print($ds / $ms)")" \
                "$hits" $(( me + de ))
        done
    done
    if (( failed > 0 )); then
        echo "FAILED: $failed runs had failed decisions (above)" >&2
        exit 1
    fi
    exit 0
fi

"$TOLLGATE" serve --grpc 127.0.0.1:0 --http 127.0.0.1:0 --config examples/ \
    --store "redis://127.0.0.1:$PORT/" ${SERVE_ARGS:-} 2>"$work/serve.log" &
SERVE=$!
until grep -qs 'grpc=' "$work/serve.log"; do sleep 0.1; done
GRPC=$(grep -o 'grpc=[0-9.:]*' "$work/serve.log" | cut -d= -f2)

# The EVALSHA one native request becomes.
redis-cli -p "$PORT" monitor >"$work/monitor.txt" &
MON=$!
sleep 0.3
"$TOLLGATE" bench --target "$GRPC" --api native --concurrency 1 --keys 1 \
    --warmup 0s --duration 200ms >/dev/null 2>&1
sleep 0.3
kill "$MON"
line=$(awk '/"EVALSHA"/ && !/\{srv\}/ { print; exit }' "$work/monitor.txt")
[[ -n "$line" ]] || { echo "no decision EVALSHA seen" >&2; exit 1; }
# The quoted words after the timestamp and client, the user made random.
mapfile -t CMD < <(python3 - "$line" <<'EOF'
import shlex, sys
words = shlex.split(sys.argv[1].split("] ", 1)[1])
for w in words:
    print(w.replace("user-0", "user-__rand_int__"))
EOF
)
echo "decision: ${CMD[*]}"

REDIS_PID=$(redis-cli -p "$PORT" info server | tr -d '\r' | awk -F: '/^process_id/ { print $2 }')
ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
HZ=$(getconf CLK_TCK)
# CPU µs Redis spent per request between two tick readings.
redis_us() { python3 -c "print(round(($2 - $1) * 1e6 / $HZ / $3, 1))"; }

rb() { # clients pipeline -> requests per second
    local n=$(( SECONDS_PER_RUN * 40000 ))
    redis-benchmark -p "$PORT" -c "$1" -P "$2" -n "$n" -r "$KEYS" -q "${CMD[@]}" |
        tr '\r' '\n' | grep -o '[0-9.]* requests per second' | tail -1 | cut -d' ' -f1
}
tb() {
    "$TOLLGATE" bench --target "$GRPC" --api native --concurrency "$CLIENTS" \
        --keys "$KEYS" --warmup 1s --duration "${SECONDS_PER_RUN}s" --server-pid "$SERVE" --json
}

# Reads `tollgate bench --json` on stdin; prints throughput, server and
# client CPU per request, requests and failed decisions, and reports
# failed decisions by kind. A file, not a `python3 -c '...'` word: quotes
# inside such a word once ended it, and the error report itself died with
# a Python NameError.
cat >"$work/report.py" <<'EOF'
import json, sys
j = json.load(sys.stdin)
cpu = lambda k: (j.get(k) or {}).get("us_per_request", 0)
print(round(j["throughput"]), cpu("server_cpu"), cpu("client_cpu"), j["requests"], j["errors"])
if j["errors"]:
    kinds = "; ".join("%s: %d" % kv for kv in sorted((j.get("error_kinds") or {}).items()))
    print("tollgate bench: %d of %d decisions failed (%s)" % (j["errors"], j["requests"], kinds),
          file=sys.stderr)
EOF

printf '%-6s %12s %12s %12s %8s %10s %10s %10s %10s %8s\n' round 'rb c'"$CLIENTS" 'rb c8 P16' tollgate ratio 'server µs' 'client µs' 'redis µs' 'rb redis' errors
failed=0
for r in $(seq 1 "$ROUNDS"); do
    sleep 2
    a=$(rb "$CLIENTS" 1)
    sleep 2
    t0=$(ticks "$REDIS_PID")
    b=$(rb 8 16)
    t1=$(ticks "$REDIS_PID")
    rbr=$(redis_us "$t0" "$t1" $(( SECONDS_PER_RUN * 40000 )))
    sleep 2
    t0=$(ticks "$REDIS_PID")
    if ! json=$(tb); then
        echo "round $r: tollgate bench did not run: $json" >&2
        failed=$(( failed + 1 ))
        continue
    fi
    t1=$(ticks "$REDIS_PID")
    read -r t s c n e < <(python3 "$work/report.py" <<<"$json") || true
    if [[ -z "${e:-}" ]]; then
        echo "round $r: cannot read tollgate bench's report: $json" >&2
        failed=$(( failed + 1 ))
        continue
    fi
    (( e == 0 )) || failed=$(( failed + 1 ))
    # The bench's warm-up also reached Redis: count it at the measured rate.
    tr=$(redis_us "$t0" "$t1" "$(python3 -c "print(int($n * ($SECONDS_PER_RUN + 1) / $SECONDS_PER_RUN))")")
    ceil=$(python3 -c "print(max($a, $b))")
    printf '%-6s %12.0f %12.0f %12s %8.2f %10s %10s %10s %10s %8s\n' "$r" "$a" "$b" "$t" "$(python3 -c "print($t / $ceil)")" "$s" "$c" "$tr" "$rbr" "$e"
done
if (( failed > 0 )); then
    echo "FAILED: $failed of $ROUNDS rounds had failed decisions or no report (above)" >&2
    exit 1
fi
