#!/usr/bin/env bash
# tollgate's HTTP API next to throttlecrab-server's and next to its own
# HTTP stack answering without deciding, pinned, in the same run
# (docs/benchmarks.md, "Side by side, pinned").
#
# Starts `tollgate serve` with scripts/bench-config/ (namespace `bench`,
# resource `gcra`: GCRA, 100 a second, a burst of 10) and
# throttlecrab-server 0.4.40 (HTTP, asked for the same limit in every
# request), both on CPU $SERVER_CPU, checks that both admit the same burst
# on a fresh key, then interleaves, ROUNDS times, `wrk -t1 -c$CONNS` on CPU
# $CLIENT_CPU against:
#   healthz         tollgate GET /healthz (the HTTP stack, no decision)
#   crab-health     throttlecrab GET /health (its HTTP stack, no decision)
#   tollgate-hot    tollgate POST /v1/request, every request for one key
#   crab-hot        throttlecrab POST /throttle, every request for one key
#   tollgate-KEYS   tollgate POST /v1/request, a key drawn per request from KEYS
#   crab-KEYS       throttlecrab POST /throttle, likewise
# A hot key is almost always rejected, each of 100,000 keys almost always
# granted, on both servers (checked: a run that decided otherwise fails).
#
# Prints one line per run (req/s, latency percentiles, CPU use of the
# server, of wrk and of everything else, status codes), the ratios per
# round, and the median [min-max] of each over the rounds. Exits 1 when a
# run had a socket error, an unexpected status or an answer without a
# decision; 2 when a tool is missing.
#
# Usage: scripts/bench-http.sh [ROUNDS] [SECONDS]   (defaults 3 and 10)
# Environment: TOLLGATE (the binary; default: built here in release),
# THROTTLECRAB (its binary; default: installed with `cargo install` into
# PEERS_ROOT, ~/.cache/tollgate-bench-peers, when missing), KEYS (default
# 100000), CONNS (wrk connections, default 32), WARMUP (seconds of
# unmeasured load before each run, default 1), CHECK (`lua`: count status
# codes and decisions in wrk's Lua response hook too, at a cost to wrk of
# about 2.5 µs per request; default: the servers' counters and wrk's own
# count of statuses of 400 or more), SERVER_CPU / CLIENT_CPU (default 0 / 1).
set -euo pipefail

ROUNDS=${1:-3}
SECONDS_PER_RUN=${2:-10}
KEYS=${KEYS:-100000}
CONNS=${CONNS:-32}
WARMUP=${WARMUP:-1}
CHECK=${CHECK:-counters}
THROTTLECRAB_VERSION=0.4.40
PEERS_ROOT=${PEERS_ROOT:-${XDG_CACHE_HOME:-$HOME/.cache}/tollgate-bench-peers}
# The limit both servers decide: GCRA, RATE per PERIOD seconds, BURST at
# once. throttlecrab's max_burst is set so that it admits the same burst
# (checked before the runs).
RATE=100
PERIOD=1
BURST=10
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh

[[ "$ROUNDS" =~ ^[1-9][0-9]*$ && "$SECONDS_PER_RUN" =~ ^[1-9][0-9]*$ ]] ||
    die "usage: $0 [ROUNDS] [SECONDS] (whole numbers, at least 1)"
[[ $CHECK == counters || $CHECK == lua ]] || die "CHECK must be counters or lua, not $CHECK"
check_pinning
need wrk "apt-get install wrk"
need curl "apt-get install curl"
need python3 "apt-get install python3"
[[ -n "${TOLLGATE:-}" ]] && TOLLGATE_GIVEN=1
tollgate_binary

# throttlecrab-server, installed outside the repository when missing. Its
# build needs protoc (tollgate's never does).
if [[ -z "${THROTTLECRAB:-}" ]]; then
    THROTTLECRAB="$PEERS_ROOT/bin/throttlecrab-server"
    if [[ ! -x "$THROTTLECRAB" ]] || ! "$THROTTLECRAB" --version 2>/dev/null | grep -q "$THROTTLECRAB_VERSION"; then
        if ! command -v protoc >/dev/null; then
            if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
                echo "installing protoc (protobuf-compiler) to build throttlecrab-server" >&2
                apt-get install -y protobuf-compiler >&2 || { apt-get update >&2 && apt-get install -y protobuf-compiler >&2; }
            else
                die "protoc is missing: throttlecrab-server needs it to build (apt-get install protobuf-compiler), or set THROTTLECRAB"
            fi
        fi
        echo "installing throttlecrab-server $THROTTLECRAB_VERSION into $PEERS_ROOT (a few minutes, once)" >&2
        (unset CARGO_TARGET_DIR; cargo install --locked throttlecrab-server --version "$THROTTLECRAB_VERSION" --root "$PEERS_ROOT" >&2) ||
            die "cargo install throttlecrab-server $THROTTLECRAB_VERSION failed"
    fi
fi
[[ -x "$THROTTLECRAB" ]] || die "THROTTLECRAB=$THROTTLECRAB is not an executable"

start_work
start_serve
CRAB_PORT=$(free_port)
on_server_cpu "$THROTTLECRAB" --http --http-host 127.0.0.1 --http-port "$CRAB_PORT" --log-level warn \
    >"$work/crab.log" 2>&1 &
CRAB=$!
pids+=("$CRAB")
serve_addresses
HTTP=$SERVE_HTTP
wait_for_port "$CRAB_PORT" "$CRAB"
CRAB_URL="http://127.0.0.1:$CRAB_PORT"

describe_build
echo "peer:       $THROTTLECRAB ($("$THROTTLECRAB" --version 2>&1 | head -1))"
echo "limit:      GCRA $RATE per ${PERIOD}s, burst $BURST, on both; wrk -t1 -c$CONNS, ${SECONDS_PER_RUN}s per run after ${WARMUP}s of warm-up; $KEYS keys"

# Both must read the limit alike: on a fresh key of a GCRA limit as slow
# as 1 a minute with the same burst (scripts/bench-config/), 3 * BURST
# requests back to back must be admitted the same number of times.
read -r t_allowed c_allowed < <(python3 - "$HTTP" "127.0.0.1:$CRAB_PORT" "$BURST" <<'EOF'
import http.client, json, sys, uuid
tg, crab, burst = sys.argv[1], sys.argv[2], int(sys.argv[3])
def count(host, path, body_of):
    c = http.client.HTTPConnection(host, timeout=5)
    key = "probe-" + uuid.uuid4().hex
    allowed = 0
    for _ in range(3 * burst):
        c.request("POST", path, json.dumps(body_of(key)), {"Content-Type": "application/json"})
        r = c.getresponse()
        body = r.read()
        try:
            answer = json.loads(body)
        except ValueError:
            sys.exit(f"{host}{path} answered {r.status} with something that is not JSON: {body[:200]!r}")
        if "allowed" not in answer:
            sys.exit(f"{host}{path} answered {r.status} without a decision: {body[:200]!r}")
        allowed += answer["allowed"] is True
    return allowed
t = count(tg, "/v1/request", lambda k: {"namespace": "bench", "resource": "gcra-burst-check", "domain": k})
c = count(crab, "/throttle", lambda k: {"key": k, "max_burst": burst, "count_per_period": 1, "period": 60})
print(t, c)
EOF
)
echo "burst:      a fresh key (1 a minute, burst $BURST), $((3 * BURST)) requests back to back: tollgate admitted $t_allowed, throttlecrab $c_allowed"
[[ -n "${t_allowed:-}" && -n "${c_allowed:-}" ]] || die "the burst check failed (above)"
if [[ "$t_allowed" != "$c_allowed" ]]; then
    # throttlecrab's max_burst may count differently from tollgate's burst.
    die "the two servers do not decide the same limit (allowed $t_allowed against $c_allowed): adjust BURST/max_burst"
fi

results="$work/results.jsonl"
: >"$results"
# The servers' own counters: "granted rejected errors" (tollgate: HTTP
# decisions in namespace `bench`; throttlecrab: all its requests).
counters() {
    if [[ $1 == throttlecrab ]]; then
        curl -sf "$CRAB_URL/metrics" | awk '
            /^throttlecrab_requests_total / { t = $2 } /^throttlecrab_requests_allowed / { a = $2 }
            /^throttlecrab_requests_denied / { d = $2 } END { print a + 0, d + 0, t - a - d }'
    else
        curl -sf "http://$HTTP/metrics" | awk '
            /^tollgate_decisions_total\{/ && /surface="http"/ && /namespace="bench"/ {
                if (/outcome="granted"/) g += $NF; else if (/outcome="rejected"/) r += $NF; else e += $NF }
            END { print g + 0, r + 0, e + 0 }'
    fi
}
counters tollgate >/dev/null || die "cannot read tollgate's /metrics"
counters throttlecrab >/dev/null || die "cannot read throttlecrab's /metrics"

# run NAME MODE URL KEYS
run() {
    local name=$1 mode=$2 url=$3 keys=$4 out c0 c1 result
    local env=(BENCH_MODE="$mode" BENCH_KEYS="$keys" BENCH_BURST="$BURST" BENCH_RATE="$RATE"
        BENCH_PERIOD="$PERIOD" BENCH_CHECK="$CHECK")
    if ((WARMUP > 0)); then
        env "${env[@]}" taskset -c "$CLIENT_CPU" wrk -t1 -c"$CONNS" -d"${WARMUP}s" -s scripts/bench-http.lua "$url" >/dev/null
    fi
    sleep 1
    local server=$SERVE
    [[ $url == "$CRAB_URL"* ]] && server=$CRAB
    c0=$(counters "$mode")
    cpu_start "$server"
    out=$(env "${env[@]}" taskset -c "$CLIENT_CPU" wrk -t1 -c"$CONNS" -d"${SECONDS_PER_RUN}s" --timeout 5s \
        -s scripts/bench-http.lua "$url") || { fail "$name: wrk exited $?"; echo "$out" >&2; return 0; }
    cpu_stop
    c1=$(counters "$mode")
    result=$(grep '^RESULT ' <<<"$out" | cut -d' ' -f2-) || { fail "$name: no RESULT line from wrk"; echo "$out" >&2; return 0; }
    python3 - "$round" "$name" "$mode" "$keys" "$CPU_SERVER" "$CPU_CLIENT" "$CPU_OTHERS" "$c0" "$c1" \
        "$CONNS" "$RATE" "$PERIOD" "$CPU_SERVER_TICKS" "$HZ" "$result" >>"$results" <<'EOF' ||
import json, sys
rnd, name, mode, keys, cs, cc, co, c0, c1, conns, rate, period, ticks, hz, raw = sys.argv[1:16]
keys, conns, limit = int(keys), int(conns), float(rate) / float(period)
r = json.loads(raw)
r.update(round=int(rnd), name=name, mode=mode, keys=keys, cpu_server=int(cs), cpu_client=int(cc), cpu_others=int(co))
r["rps"] = r["requests"] * 1e6 / r["duration_us"]
# The server's CPU time per answer: its own cost, whatever else ran.
r["server_us"] = int(ticks) / int(hz) * 1e6 / max(1, r["requests"])
n, bad = r["requests"], r["status_errors"]
problems = []
if any(r["socket_errors"].values()):
    problems.append(f"socket errors {r['socket_errors']}")
if r["checked"]:
    expected = {"get": {"200"}, "tollgate": {"200", "429"}, "throttlecrab": {"200"}}[mode]
    odd = {c: k for c, k in r["codes"].items() if c not in expected}
    if odd:
        problems.append(f"unexpected status codes {odd}")
else:
    # wrk's own count: answers with a status of 400 or more.
    r["codes"] = {k: v for k, v in (("2xx/3xx", n - bad), (">=400", bad)) if v}
if mode == "get":
    if bad:
        problems.append(f"{bad} answers with a status of 400 or more")
else:
    # The server's own count of what it decided while wrk ran. It also
    # counts the requests in flight when wrk stopped (at most one per
    # connection), which wrk does not.
    (g0, j0, e0), (g1, j1, e1) = ([float(x) for x in c.split()] for c in (c0, c1))
    g, j, e = int(g1 - g0), int(j1 - j0), int(e1 - e0)
    r.update(server_granted=g, server_rejected=j, server_errors=e)
    if e:
        problems.append(f"the server counted {e} errors")
    if not 0 <= g + j - n <= conns:
        problems.append(f"the server decided {g + j} requests, wrk counted {n} answers")
    expect_bad = j if mode == "tollgate" else 0  # tollgate answers a rejection 429
    if abs(bad - expect_bad) > conns:
        problems.append(f"{bad} answers with a status of 400 or more, expected {expect_bad}")
    if r["checked"] and r["granted"] + r["rejected"] != n:
        problems.append(f"{n - r['granted'] - r['rejected']} answers carried no decision")
    share = j / max(1, g + j) if keys == 1 else g / max(1, g + j)
    want = 0.9 if keys == 1 else 0.99
    if share < want:
        what = "rejected" if keys == 1 else "granted"
        problems.append(f"only {share:.1%} {what} (expected at least {want:.0%}): not the path the comparison is about")
    if keys == 1:
        # One key: GCRA lets its rate through, whoever decides.
        secs = r["duration_us"] / 1e6
        r["granted_per_s"] = g / secs
        if abs(g / secs - limit) > 0.2 * limit + 20 / secs:
            problems.append(f"{g / secs:.0f} grants a second on one key; the limit is {rate} per {period}s")
if n == 0:
    problems.append("no request answered")
r["failed"] = bool(problems)
print(json.dumps(r))
if mode == "get":
    decided = ""
elif keys == 1:
    decided = f"  granted {r['server_granted']} ({r['granted_per_s']:.0f}/s), rejected {r['server_rejected']}"
else:
    decided = f"  granted {r['server_granted'] / max(1, r['server_granted'] + r['server_rejected']):.1%}"
line = (f"{r['round']:>5} {name:<16} {r['rps']:>10,.0f} {r['p50_us']:>8} {r['p99_us']:>8} {r['p999_us']:>8} "
        f"{r['cpu_server']:>5}% {r['server_us']:>6.1f} {r['cpu_client']:>5}% {r['cpu_others']:>5}%  "
        + " ".join(f"{c}:{k}" for c, k in sorted(r["codes"].items())) + decided)
print(line, file=sys.stderr)
for p in problems:
    print(f"  {name}: {p}", file=sys.stderr)
sys.exit(1 if problems else 0)
EOF
        { fail "$name (round $round): see above"; sample_answer "$mode" "$url"; }
}

# One request of the kind a run sent, and its answer, to show what went
# wrong.
sample_answer() {
    local body=
    case $1 in
    tollgate) body='{"namespace":"bench","resource":"gcra","domain":"user-0"}' ;;
    throttlecrab) body="{\"key\":\"user-0\",\"max_burst\":$BURST,\"count_per_period\":$RATE,\"period\":$PERIOD}" ;;
    esac
    echo "  one such request: ${body:-GET} $2" >&2
    if [[ -n $body ]]; then
        curl -s -i -H 'Content-Type: application/json' -d "$body" "$2" | head -c 600 | sed 's/^/    /' >&2
    else
        curl -s -i "$2" | head -c 600 | sed 's/^/    /' >&2
    fi
    echo >&2
}

echo
printf '%5s %-16s %10s %8s %8s %8s %6s %6s %6s %6s  %s\n' round run 'req/s' 'p50 µs' 'p99 µs' 'p99.9' server 'µs/req' wrk others 'status codes' >&2
for round in $(seq 1 "$ROUNDS"); do
    run healthz get "http://$HTTP/healthz" 1
    run crab-health get "$CRAB_URL/health" 1
    run tollgate-hot tollgate "http://$HTTP/v1/request" 1
    run crab-hot throttlecrab "$CRAB_URL/throttle" 1
    run "tollgate-$KEYS" tollgate "http://$HTTP/v1/request" "$KEYS"
    run "crab-$KEYS" throttlecrab "$CRAB_URL/throttle" "$KEYS"
done

echo
python3 - "$results" "$KEYS" <<'EOF'
import sys
sys.path.insert(0, "scripts")
from bench_summary import load_runs, span
runs = load_runs(sys.argv[1])
keys = sys.argv[2]
by = {}
for r in runs:
    by.setdefault(r["round"], {})[r["name"]] = r
ratios = [
    ("tollgate-hot / crab-hot", "tollgate-hot", "crab-hot"),
    (f"tollgate-{keys} / crab-{keys}", f"tollgate-{keys}", f"crab-{keys}"),
    ("tollgate-hot / healthz", "tollgate-hot", "healthz"),
    (f"tollgate-{keys} / healthz", f"tollgate-{keys}", "healthz"),
    ("crab-hot / crab-health", "crab-hot", "crab-health"),
    ("healthz / crab-health", "healthz", "crab-health"),
]
print("ratios per round: req/s a/b, and in brackets the server's CPU per request b/a (above 1: a costs")
print("its server less); a round is only as good as its `others` column")
print(f"{'round':>5} " + " ".join(f"{n:>30}" for n, _, _ in ratios))
per = {n: [] for n, _, _ in ratios}
per_cpu = {n: [] for n, _, _ in ratios}
for rnd in sorted(by):
    cells = []
    for n, a, b in ratios:
        if a in by[rnd] and b in by[rnd]:
            v = by[rnd][a]["rps"] / by[rnd][b]["rps"]
            c = by[rnd][b]["server_us"] / by[rnd][a]["server_us"] if by[rnd][a]["server_us"] else 0
            per[n].append(v)
            per_cpu[n].append(c)
            cells.append(f"{f'{v:.3f} ({c:.3f})':>30}")
        else:
            cells.append(f"{'-':>30}")
    print(f"{rnd:>5} " + " ".join(cells))
print()
print("over the rounds, median [min-max]:")
names = []
for r in runs:
    if r["name"] not in names:
        names.append(r["name"])
for name in names:
    rs = [r for r in runs if r["name"] == name]
    print(f"  {name:<16} {span([r['rps'] for r in rs], lambda v: f'{v:,.0f}'):>28} req/s, "
          f"p99 {span([r['p99_us'] for r in rs], lambda v: f'{v:,.0f}')} µs, "
          f"server CPU {span([r['cpu_server'] for r in rs], lambda v: f'{v:.0f}%')}, "
          f"{span([r['server_us'] for r in rs], lambda v: f'{v:.1f}')} µs per request")
for n, _, _ in ratios:
    print(f"  {n:<30} req/s {span(per[n], lambda v: f'{v:.3f}')}, CPU per request (b/a) {span(per_cpu[n], lambda v: f'{v:.3f}')}")
EOF

if ((FAILED)); then
    echo "some runs failed (above): their figures are not speed" >&2
    exit 1
fi
