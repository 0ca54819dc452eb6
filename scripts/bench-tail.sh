#!/usr/bin/env bash
# Tail latency at half of the peak, pinned, for Envoy RLS, native gRPC and
# HTTP (docs/benchmarks.md, "Side by side, pinned"; the goal: p99 under
# 1 ms).
#
# Starts `tollgate serve` with scripts/bench-config/ and `tollgate
# bench-echo` on CPU $SERVER_CPU. Then, ROUNDS times, for each API:
#   1. the peak: `tollgate bench` closed loop against serve (CONC in
#      flight, HTTP_CONC for HTTP), PEAK_SECONDS, on CPU $CLIENT_CPU;
#   2. open loop (`--rate`, latency from each request's intended send
#      time) at FRACTION (default 0.5) of that peak, OPEN_CONC in flight,
#      SECONDS: against the echo at the same rate (gRPC only: the ceiling's
#      own latency), then against serve;
#   3. the same at each rate of RATES (fixed req/s, e.g. "1000 5000"), if
#      given.
# Keys are drawn from KEYS (granted path). With DRIVER=h2load, nghttp2's
# h2load drives every run instead (C, a fraction of `tollgate bench`'s CPU
# per request, so its pacing holds at rates where `tollgate bench`'s open
# loop falls behind): CONC streams over 4 connections for gRPC, HTTP_CONC
# HTTP/1.1 connections for HTTP, each at its share of the rate (`--rps`);
# one prepared body, so the hot key (rejected path); latency from each
# request's start as h2load logs it (`--log-file`). Prints one line per run
# (offered and answered rate, p50/p90/p99/p99.9, the client's own send
# lag p99, CPU of server, client and everything else) and the median
# [min-max] of p99 per API and rate over the rounds. Exits 1 when a run
# had errors, 2 when a tool is missing.
#
# Usage: scripts/bench-tail.sh [ROUNDS] [SECONDS]   (defaults 3 and 10)
# Environment: TOLLGATE (the binary; default: built here in release),
# DRIVER (bench or h2load, default bench),
# APIS (default "rls native http"), KEYS (default 100000), CONC (peak,
# default 128), HTTP_CONC (HTTP peak, default 64), OPEN_CONC (default 64),
# PEAK_SECONDS (default 5), FRACTION (default 0.5), RATES (default none),
# WARMUP (seconds, default 1), SERVER_CPU / CLIENT_CPU (default 0 / 1).
set -euo pipefail

ROUNDS=${1:-3}
SECONDS_PER_RUN=${2:-10}
APIS=${APIS:-rls native http}
KEYS=${KEYS:-100000}
CONC=${CONC:-128}
HTTP_CONC=${HTTP_CONC:-64}
OPEN_CONC=${OPEN_CONC:-64}
PEAK_SECONDS=${PEAK_SECONDS:-5}
FRACTION=${FRACTION:-0.5}
RATES=${RATES:-}
WARMUP=${WARMUP:-1}
DRIVER=${DRIVER:-bench}
H2_CONNS=4
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh

[[ "$ROUNDS" =~ ^[1-9][0-9]*$ && "$SECONDS_PER_RUN" =~ ^[1-9][0-9]*$ && "$PEAK_SECONDS" =~ ^[1-9][0-9]*$ ]] ||
    die "usage: $0 [ROUNDS] [SECONDS] (whole numbers, at least 1; PEAK_SECONDS too)"
python3 -c "import sys; f = float(sys.argv[1]); sys.exit(0 if 0 < f <= 1 else 1)" "$FRACTION" 2>/dev/null ||
    die "FRACTION must be a number in (0, 1], not $FRACTION"
for a in $APIS; do [[ $a == rls || $a == native || $a == http ]] || die "APIS: unknown API $a (rls, native, http)"; done
[[ $DRIVER == bench || $DRIVER == h2load ]] || die "DRIVER must be bench or h2load, not $DRIVER"
[[ $DRIVER == h2load ]] && need h2load "apt-get install nghttp2-client"
((CONC % H2_CONNS == 0)) || die "CONC ($CONC) must be a multiple of $H2_CONNS (h2load's gRPC connections)"
check_pinning
need python3 "apt-get install python3"
[[ -n "${TOLLGATE:-}" ]] && TOLLGATE_GIVEN=1
tollgate_binary

start_work
start_serve_and_echo

describe_build
echo "driver:     $DRIVER$([[ $DRIVER == h2load ]] && echo " ($(h2load --version 2>&1 | head -1)), hot key")"
echo "runs:       peak ${PEAK_SECONDS}s closed loop ($CONC in flight, HTTP $HTTP_CONC), then ${SECONDS_PER_RUN}s open loop at $FRACTION of it${RATES:+ and at $RATES req/s}, $OPEN_CONC in flight, ${WARMUP}s warm-up each; $KEYS keys"

results="$work/results.jsonl"
: >"$results"
if [[ $DRIVER == h2load ]]; then
    for api in $APIS; do
        if [[ $api == http ]]; then
            echo '{"namespace":"bench","resource":"gcra","domain":"user-0"}' >"$work/http.bin"
        else
            python3 scripts/bench-grpc-client.py --api "$api" --target - --write-body "$work/$api.bin"
        fi
    done
fi
# h2load_run API ADDR SECONDS CONCURRENCY [RATE]: one h2load run, its
# per-request log in $work/h2.log; prints h2load's output.
h2load_run() {
    local api=$1 addr=$2 secs=$3 conc=$4 rate=${5:-} args=()
    if [[ $api == http ]]; then
        args=(--h1 -c"$conc" -m1 -H 'content-type: application/json' "http://$addr/v1/request")
        [[ -n $rate ]] && args+=(--rps "$(((rate + conc - 1) / conc))")
    else
        local path=/tollgate.v1.Tollgate/Request
        [[ $api == rls ]] && path=/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit
        args=(-c"$H2_CONNS" -m"$((conc / H2_CONNS))" -H 'content-type: application/grpc' -H 'te: trailers' "http://$addr$path")
        [[ -n $rate ]] && args+=(--rps "$(((rate + H2_CONNS - 1) / H2_CONNS))")
    fi
    on_client_cpu h2load -t1 -D "$secs" --warm-up-time "$WARMUP" -d "$work/$api.bin" \
        --log-file "$work/h2.log" "${args[@]}" 2>&1
}
# bench NAME API TARGET(echo|serve) SECONDS CONCURRENCY [RATE]: one run.
bench() {
    local name=$1 api=$2 target=$3 secs=$4 conc=$5 rate=${6:-} addr pid out extra=()
    if [[ $target == echo ]]; then addr=$ECHO_GRPC pid=$ECHO; else pid=$SERVE; addr=$SERVE_GRPC; fi
    [[ $api == http ]] && addr=$SERVE_HTTP
    if [[ $api == rls ]]; then extra=(--domain-name bench-rls --descriptor-key user); else extra=(--namespace bench --resource gcra); fi
    [[ -n $rate ]] && extra+=(--rate "$rate")
    sleep 1
    cpu_start "$pid"
    if [[ $DRIVER == h2load ]]; then
        rm -f "$work/h2.log"
        out=$(h2load_run "$api" "$addr" "$secs" "$conc" "$rate") || true
        out=$(python3 scripts/bench_h2load_log.py "$work/h2.log" "$secs" "$WARMUP" "$out")
    else
        out=$(on_client_cpu "$TOLLGATE" bench --target "$addr" --api "$api" "${extra[@]}" --keys "$KEYS" \
            --concurrency "$conc" --threads 1 --warmup "${WARMUP}s" --duration "${secs}s" \
            --server-pid "$pid" --json 2>&1) || true
    fi
    cpu_stop
    python3 - "$round" "$name" "$api" "$target" "${rate:-0}" "$CPU_CLIENT" "$CPU_OTHERS" "$out" >>"$results" <<'EOF' ||
import json, sys
rnd, name, api, target, rate, cc, co, out = sys.argv[1:9]
try:
    j = json.loads(out[out.index("{"):])
except ValueError:
    print(f"  {name} {api} {target}: tollgate bench failed:\n{out[-2000:]}", file=sys.stderr)
    sys.exit(1)
lat = j["latency_us"]
lag = (j.get("send_lag_us") or {}).get("p99")
r = dict(round=int(rnd), name=name, api=api, target=target, offered=float(rate), rps=j["throughput"],
         p50=lat["p50"], p90=lat["p90"], p99=lat["p99"], p999=lat["p999"], lag_p99=lag,
         errors=j["errors"], unsent=j.get("unsent", 0), granted=j["granted"], requests=j["requests"],
         cpu_server=round(100 * j["server_cpu"]["cores"]) if j.get("server_cpu") else None,
         cpu_client=int(cc), cpu_others=int(co), failed=bool(j["errors"]))
print(json.dumps(r))
f = lambda v: "-" if v is None else f"{v:,.0f}"
print(f"{r['round']:>5} {api:<6} {name:<8} {target:<5} {f(r['offered'] or None):>9} {r['rps']:>9,.0f} {f(r['p50']):>7} {f(r['p90']):>7} "
      f"{f(r['p99']):>8} {f(r['p999']):>8} {f(lag):>8} {f(r['cpu_server']):>5}% {r['cpu_client']:>5}% {r['cpu_others']:>5}%", file=sys.stderr)
if j["errors"]:
    print(f"  {name} {api} {target}: {j['errors']} errors: {j.get('error_kinds')}", file=sys.stderr)
    sys.exit(1)
EOF
        fail "$name $api $target (round $round)"
}

echo
printf '%5s %-6s %-8s %-5s %9s %9s %7s %7s %8s %8s %8s %6s %6s %6s\n' round api run srv offered 'req/s' 'p50 µs' 'p90 µs' 'p99 µs' 'p99.9' 'lag p99' server client others >&2
for round in $(seq 1 "$ROUNDS"); do
    for api in $APIS; do
        conc=$CONC
        [[ $api == http ]] && conc=$HTTP_CONC
        bench peak "$api" serve "$PEAK_SECONDS" "$conc"
        # This round's peak of this API, if it was measured without error.
        half=$(python3 - "$results" "$round" "$api" "$FRACTION" <<'EOF'
import json, sys
path, rnd, api, fraction = sys.argv[1:5]
runs = [json.loads(l) for l in open(path)] if open(path).read().strip() else []
r = runs[-1] if runs else {}
if r.get("round") == int(rnd) and r.get("api") == api and r.get("name") == "peak" and not r.get("failed"):
    print(round(r["rps"] * float(fraction)))
EOF
        )
        if [[ -z $half ]]; then
            fail "$api (round $round): no peak measured, so no run at a fraction of it"
            continue
        fi
        for rate in "$half" $RATES; do
            name=$([[ $rate == "$half" ]] && echo "x$FRACTION" || echo "fixed")
            [[ $api != http ]] && bench "$name" "$api" echo "$SECONDS_PER_RUN" "$OPEN_CONC" "$rate"
            bench "$name" "$api" serve "$SECONDS_PER_RUN" "$OPEN_CONC" "$rate"
        done
    done
done

echo
python3 - "$results" <<'EOF'
import sys
sys.path.insert(0, "scripts")
from bench_summary import load_runs, span
runs = load_runs(sys.argv[1])
groups = {}
for r in runs:
    if r["name"] == "peak":
        key = (r["api"], "peak", r["target"])
    else:
        key = (r["api"], r["name"] if r["name"] != "fixed" else f"{r['offered']:.0f}/s", r["target"])
    groups.setdefault(key, []).append(r)
print("over the rounds, median [min-max] (µs; the goal: serve's p99 under 1,000 at half of the peak)")
for (api, name, target), rs in groups.items():
    print(f"  {api:<6} {name:<8} {target:<5} req/s {span([r['rps'] for r in rs]):<26} p50 {span([r['p50'] for r in rs]):<20} "
          f"p99 {span([r['p99'] for r in rs]):<24} p99.9 {span([r['p999'] for r in rs]):<24} send lag p99 {span([r['lag_p99'] for r in rs])}")
EOF

if ((FAILED)); then
    echo "some runs failed (above): their figures are not speed" >&2
    exit 1
fi
