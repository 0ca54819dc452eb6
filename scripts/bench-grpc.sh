#!/usr/bin/env bash
# tollgate's gRPC APIs (Envoy RLS and native) next to the no-op ceiling,
# `tollgate bench-echo`, pinned, driven by three load generators, in the
# same run (docs/benchmarks.md, "Side by side, pinned").
#
# Starts `tollgate serve` with scripts/bench-config/ (GCRA, 100 a second, a
# burst of 10: namespace `bench`/resource `gcra` for native, Envoy domain
# `bench-rls` with descriptor `user` for RLS) and `tollgate bench-echo`, both on
# CPU $SERVER_CPU. Then, ROUNDS times, for each API, for a hot key (user-0:
# almost always rejected by serve) and for KEYS keys (almost always
# granted), for each driver, echo then serve, each on CPU $CLIENT_CPU:
#   bench   `tollgate bench`, CONC in flight over 4 HTTP/2 connections
#   h2load  nghttp2's h2load: CONC streams over 4 connections, every
#           request the same body (so hot key only). It reads HTTP
#           statuses, never grpc-status: the body is checked once against
#           each server, and each run against serve is checked with
#           serve's decision counters (/metrics)
#   python  Python grpcio (asyncio, one channel, PY_CONC in flight;
#           scripts/bench-grpc-client.py, its stubs generated at run time)
#
# Prints one line per run: req/s, latency, the server's CPU (% of its core
# over the load, and µs per request), the driver's and everyone else's
# CPU. Then per round the ratio serve/echo of req/s, and echo/serve of
# the server's CPU per request (the server's own cost, meaningful even
# when the driver, not the server, was the bottleneck), and their median
# [min-max]. A run whose server used less than 90% of its core was bound
# by its driver (or by other processes: see `others`): its req/s ratio
# says little. Exits 1 when a run had an
# error, 2 when a tool is missing.
#
# Usage: scripts/bench-grpc.sh [ROUNDS] [SECONDS]   (defaults 3 and 5)
# Environment: TOLLGATE (the binary; default: built here in release),
# DRIVERS (default "bench h2load python"), APIS (default "rls native"),
# KEYS (default 100000), CONC (default 128), PY_CONC (default 128), WARMUP
# (seconds, default 1), SERVER_CPU / CLIENT_CPU (default 0 / 1).
set -euo pipefail

ROUNDS=${1:-3}
SECONDS_PER_RUN=${2:-5}
DRIVERS=${DRIVERS:-bench h2load python}
APIS=${APIS:-rls native}
KEYS=${KEYS:-100000}
CONC=${CONC:-128}
PY_CONC=${PY_CONC:-128}
WARMUP=${WARMUP:-1}
H2_CONNS=4
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh

[[ "$ROUNDS" =~ ^[1-9][0-9]*$ && "$SECONDS_PER_RUN" =~ ^[1-9][0-9]*$ ]] ||
    die "usage: $0 [ROUNDS] [SECONDS] (whole numbers, at least 1)"
((CONC % H2_CONNS == 0)) || die "CONC ($CONC) must be a multiple of $H2_CONNS (h2load's connections)"
check_pinning
need python3 "apt-get install python3"
need curl "apt-get install curl"
for d in $DRIVERS; do
    case $d in
    bench) ;;
    h2load) need h2load "apt-get install nghttp2-client" ;;
    python) python3 -c 'import grpc, grpc_tools' 2>/dev/null ||
        die "python3's grpcio or grpcio-tools is missing (pip install grpcio grpcio-tools)" ;;
    *) die "DRIVERS: unknown driver $d (bench, h2load, python)" ;;
    esac
done
for a in $APIS; do [[ $a == rls || $a == native ]] || die "APIS: unknown API $a (rls, native)"; done
[[ -n "${TOLLGATE:-}" ]] && TOLLGATE_GIVEN=1
tollgate_binary

start_work
start_serve_and_echo

describe_build
echo "drivers:    $DRIVERS; $CONC in flight (python: $PY_CONC); ${SECONDS_PER_RUN}s per run after ${WARMUP}s of warm-up; hot key and $KEYS keys"
[[ " $DRIVERS " == *" h2load "* ]] && echo "h2load:     $(h2load --version 2>&1 | head -1)"
[[ " $DRIVERS " == *" python "* ]] && echo "python:     $(python3 -c 'import grpc, sys; print(sys.version.split()[0], "grpcio", grpc.__version__)')"

path_of() { [[ $1 == rls ]] && echo /envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit || echo /tollgate.v1.Tollgate/Request; }
surface_of() { [[ $1 == rls ]] && echo rls || echo grpc; }
bench_args() { # API -> what tollgate bench needs to send the bench config's requests
    if [[ $1 == rls ]]; then echo "--domain-name bench-rls --descriptor-key user"; else echo "--namespace bench --resource gcra"; fi
}
# serve's decision counters of one surface, for the bench config's
# namespace (`bench`, or the Envoy domain `bench-rls`; a request matching
# no limit counts under `_unconfigured`): "granted rejected error".
decisions() {
    curl -sf "http://$SERVE_HTTP/metrics" | python3 -c '
import re, sys
surface = sys.argv[1]
namespace = "bench-rls" if surface == "rls" else "bench"
n = {"granted": 0, "rejected": 0, "error": 0}
for line in sys.stdin:
    if (line.startswith("tollgate_decisions_total{") and f"surface=\"{surface}\"" in line
            and f"namespace=\"{namespace}\"" in line):
        m = re.search(r"outcome=\"(\w+)\"", line)
        if m and m.group(1) in n:
            n[m.group(1)] += float(line.rsplit(" ", 1)[1])
print(int(n["granted"]), int(n["rejected"]), int(n["error"]))' "$1"
}

# h2load's bodies, checked against both servers: the request must be
# decided (serve) or answered OK (echo), as gRPC, not only as HTTP.
decisions rls >/dev/null || die "cannot read tollgate_decisions_total from http://$SERVE_HTTP/metrics"
if [[ " $DRIVERS " == *" h2load "* ]]; then
    for api in $APIS; do
        python3 scripts/bench-grpc-client.py --api "$api" --target - --write-body "$work/$api.bin"
        for t in "$SERVE_GRPC" "$ECHO_GRPC"; do
            read -r g0 j0 _ < <(decisions "$(surface_of "$api")")
            python3 scripts/bench-grpc-client.py --api "$api" --target "$t" --check >"$work/check.json" ||
                die "the h2load body for $api is not answered as expected by $t: $(cat "$work/check.json")"
            read -r g1 j1 _ < <(decisions "$(surface_of "$api")")
            # serve must have decided it (an RLS request matching no limit
            # is answered OK too).
            [[ $t != "$SERVE_GRPC" ]] || (((g1 + j1) - (g0 + j0) == 1)) ||
                die "serve answered the h2load body for $api without deciding it (check scripts/bench-config/)"
        done
    done
    echo "h2load:     bodies checked (decided by serve, answered OK by the echo)"
fi

results="$work/results.jsonl"
: >"$results"
# run API KEYS DRIVER TARGET(echo|serve)
run() {
    local api=$1 keys=$2 driver=$3 target=$4 addr pid out dec0 dec1
    if [[ $target == echo ]]; then addr=$ECHO_GRPC pid=$ECHO; else addr=$SERVE_GRPC pid=$SERVE; fi
    sleep 1
    dec0=$(decisions "$(surface_of "$api")" 2>/dev/null || echo "0 0 0")
    cpu_start "$pid"
    case $driver in
    bench)
        # shellcheck disable=SC2046
        out=$(on_client_cpu "$TOLLGATE" bench --target "$addr" --api "$api" $(bench_args "$api") \
            --keys "$keys" --concurrency "$CONC" --threads 1 --warmup "${WARMUP}s" \
            --duration "${SECONDS_PER_RUN}s" --server-pid "$pid" --json 2>&1) || true
        ;;
    h2load)
        out=$(on_client_cpu h2load -t1 -c"$H2_CONNS" -m$((CONC / H2_CONNS)) -D "$SECONDS_PER_RUN" \
            --warm-up-time "$WARMUP" -d "$work/$api.bin" -H 'content-type: application/grpc' \
            -H 'te: trailers' "http://$addr$(path_of "$api")" 2>&1) || true
        ;;
    python)
        out=$(on_client_cpu python3 scripts/bench-grpc-client.py --target "$addr" --api "$api" \
            --keys "$keys" --concurrency "$PY_CONC" --warmup "$WARMUP" --duration "$SECONDS_PER_RUN" 2>&1) || true
        ;;
    esac
    cpu_stop
    dec1=$(decisions "$(surface_of "$api")" 2>/dev/null || echo "0 0 0")
    python3 - "$round" "$api" "$keys" "$driver" "$target" "$CPU_SERVER" "$CPU_CLIENT" "$CPU_OTHERS" \
        "$dec0" "$dec1" "$WARMUP" "$SECONDS_PER_RUN" "$HZ" "$CPU_SERVER_TICKS" "$out" >>"$results" <<'EOF' ||
import json, re, sys
rnd, api, keys, driver, target, cs, cc, co, dec0, dec1, warm, secs, hz, ticks, out = sys.argv[1:16]
keys, warm, secs = int(keys), float(warm), float(secs)
server_s = int(ticks) / int(hz)
r = dict(round=int(rnd), api=api, keys=keys, driver=driver, target=target,
         cpu_server=int(cs), cpu_client=int(cc), cpu_others=int(co))
problems = []
loaded = warm + secs  # seconds the server was under load in the window
try:
    if driver == "bench" or driver == "python":
        j = json.loads(out[out.index("{"):])
        r.update(requests=j["requests"], rps=j["throughput"], granted=j["granted"],
                 rejected=j["rejected"], errors=j["errors"], error_kinds=j.get("error_kinds", {}),
                 p50=j["latency_us"]["p50"], p99=j["latency_us"]["p99"])
        if driver == "bench" and j.get("server_cpu"):
            # tollgate bench's own reading, over the measured window only.
            r["server_us"] = j["server_cpu"]["us_per_request"]
            r["cpu_server"] = round(100 * j["server_cpu"]["cores"])
    else:
        m = re.search(r"requests: (\d+) total, (\d+) started, (\d+) done, (\d+) succeeded, (\d+) failed, (\d+) errored, (\d+) timeout", out)
        rps = re.search(r"finished in [0-9.]+\w*, ([0-9.]+) req/s", out)
        codes = re.search(r"status codes: (\d+) 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx", out)
        mean = re.search(r"time for request:\s+\S+\s+\S+\s+(\S+)", out)
        total, started, done, ok, failed, errored, timeout = map(int, m.groups())
        r.update(requests=done, rps=float(rps.group(1)), errors=failed + errored + timeout,
                 error_kinds={k: v for k, v in (("failed", failed), ("errored", errored), ("timeout", timeout)) if v},
                 p50=None, p99=None, mean=mean.group(1) if mean else None)
        if int(codes.group(1)) != done:
            problems.append(f"h2load: {done} done but {codes.group(1)} with HTTP 2xx")
        if target == "serve":
            # Every request h2load sent (warm-up included) must have been
            # decided, none in error.
            g0, j0, e0 = map(int, dec0.split())
            g1, j1, e1 = map(int, dec1.split())
            r.update(granted=g1 - g0, rejected=j1 - j0)
            if e1 != e0:
                problems.append(f"serve counted {e1 - e0} decisions in error")
            if (g1 - g0) + (j1 - j0) < done:
                problems.append(f"serve decided {(g1 - g0) + (j1 - j0)} requests, fewer than h2load's {done} answers")
        else:
            r.update(granted=done, rejected=0)
    if target == "serve" and driver != "h2load":
        # serve's own count: every answer the driver counted (warm-up
        # runs too) must have been decided, none in error.
        g0, j0, e0 = map(int, dec0.split())
        g1, j1, e1 = map(int, dec1.split())
        if e1 != e0:
            problems.append(f"serve counted {e1 - e0} decisions in error")
        if (g1 - g0) + (j1 - j0) < r["requests"]:
            problems.append(f"serve decided {(g1 - g0) + (j1 - j0)} requests, fewer than the driver's {r['requests']} answers")
except (ValueError, KeyError, AttributeError, TypeError) as e:
    print(f"  {api} {keys} {driver} {target}: cannot read the driver's output ({e!r}):\n{out[-2000:]}", file=sys.stderr)
    sys.exit(1)
if "server_us" not in r and r["rps"] > 0:
    # The server's CPU over the whole run (warm-up included) for the
    # requests of the whole run, at the measured rate; its busy share over
    # the time under load (the driver's start-up excluded).
    r["server_us"] = round(server_s * 1e6 / (r["rps"] * loaded), 1)
    r["cpu_server"] = round(100 * server_s / loaded)
if r["errors"]:
    problems.append(f"{r['errors']} errors: {r['error_kinds']}")
decided = r.get("granted", 0) + r.get("rejected", 0)
if target == "serve" and decided:
    share = r["rejected"] / decided if keys == 1 else r["granted"] / decided
    want = 0.9 if keys == 1 else 0.99
    if share < want:
        what = "rejected" if keys == 1 else "granted"
        problems.append(f"only {share:.1%} {what} (expected at least {want:.0%}): not the path the comparison is about")
if target == "echo" and r.get("rejected"):
    problems.append(f"the echo rejected {r['rejected']}")
if r["requests"] == 0:
    problems.append("no request answered")
r["failed"] = bool(problems)
print(json.dumps(r))
fmt = lambda v: "-" if v is None else f"{v:,.0f}"
granted = f"{r['granted'] / decided:.1%}" if decided else "-"
print(f"{r['round']:>5} {api:<6} {keys:>6} {driver:<6} {target:<5} {r['rps']:>9,.0f} {fmt(r.get('p50')):>7} {fmt(r.get('p99')):>7} "
      f"{r['cpu_server']:>5}% {r.get('server_us', 0):>6.1f} {r['cpu_client']:>5}% {r['cpu_others']:>5}% {granted:>7}", file=sys.stderr)
for p in problems:
    print(f"  {api} {keys} {driver} {target}: {p}", file=sys.stderr)
sys.exit(1 if problems else 0)
EOF
        fail "$api $keys $driver $target (round $round)"
}

echo
printf '%5s %-6s %6s %-6s %-5s %9s %7s %7s %6s %6s %6s %6s %7s\n' round api keys driver srv 'req/s' 'p50 µs' 'p99 µs' server 'µs/req' driver others granted >&2
for round in $(seq 1 "$ROUNDS"); do
    for api in $APIS; do
        for keys in 1 "$KEYS"; do
            for driver in $DRIVERS; do
                [[ $driver == h2load && $keys != 1 ]] && continue
                run "$api" "$keys" "$driver" echo
                run "$api" "$keys" "$driver" serve
            done
        done
    done
done

echo
python3 - "$results" <<'EOF'
import sys
sys.path.insert(0, "scripts")
from bench_summary import load_runs, span
runs = load_runs(sys.argv[1])
pairs = {}
for r in runs:
    pairs.setdefault((r["api"], r["keys"], r["driver"]), {}).setdefault(r["round"], {})[r["target"]] = r
print("serve next to echo, per round: req/s serve/echo, and the server's CPU per request echo/serve")
print(f"{'api':<6} {'keys':>6} {'driver':<6} {'round':>5} {'serve req/s':>11} {'echo req/s':>10} {'req/s ratio':>11} {'CPU ratio':>9}  bound by")
summary = []
for (api, keys, driver), rounds in pairs.items():
    rr, cr = [], []
    for rnd in sorted(rounds):
        s, e = rounds[rnd].get("serve"), rounds[rnd].get("echo")
        if not s or not e or not e["rps"]:
            continue
        ratio = s["rps"] / e["rps"]
        cpu = e["server_us"] / s["server_us"] if s.get("server_us") and e.get("server_us") else None
        rr.append(ratio)
        if cpu:
            cr.append(cpu)
        busy = max(s["cpu_others"], e["cpu_others"])
        if busy >= 10:
            bound = f"the machine: others used {busy}% of a CPU"
        elif s["cpu_server"] >= 90:
            bound = "server"
        else:
            bound = f"driver (serve at {s['cpu_server']}% of its core)"
        print(f"{api:<6} {keys:>6} {driver:<6} {rnd:>5} {s['rps']:>11,.0f} {e['rps']:>10,.0f} {ratio:>11.3f} "
              f"{'-' if cpu is None else f'{cpu:.3f}':>9}  {bound}")
    summary.append((api, keys, driver, rr, cr))
print()
print("over the rounds, median [min-max]:")
for api, keys, driver, rr, cr in summary:
    print(f"  {api:<6} {keys:>6} {driver:<6} req/s serve/echo {span(rr, lambda v: f'{v:.3f}')}, "
          f"CPU per request echo/serve {span(cr, lambda v: f'{v:.3f}')}")
EOF

if ((FAILED)); then
    echo "some runs failed (above): their figures are not speed" >&2
    exit 1
fi
