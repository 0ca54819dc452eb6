"""Reads h2load's per-request log (`--log-file`) into the JSON that
`tollgate bench --json` prints, so bench-tail.sh reports either alike.

Usage: bench_h2load_log.py LOG SECONDS WARMUP H2LOAD_OUTPUT

h2load's log has one line per request: its start (µs since the epoch), the
HTTP status, and µs until the end of its answer. Requests of the warm-up
are logged too; they are left out here. Statuses other than 200 and 429
(the hot key, rejected over HTTP) count as errors.
"""
import json
import sys

path, secs, warmup, text = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
try:
    rows = [line.split("\t") for line in open(path) if line.strip()]
except OSError:
    rows = []
if not rows:
    print(json.dumps({"error": "h2load logged no request", "output": text[-1500:]}))
    sys.exit(1)
first = min(int(r[0]) for r in rows)
rows = [r for r in rows if int(r[0]) >= first + warmup * 1e6]
# The rate over the span the kept requests were started in (h2load's
# duration may or may not count its warm-up, depending on its version).
starts = [int(r[0]) for r in rows]
span = (max(starts) - min(starts)) / 1e6 if len(starts) > 1 else secs
latencies = sorted(int(r[2]) for r in rows)
bad = [r for r in rows if r[1] not in ("200", "429")]


def pct(p):
    return latencies[min(len(latencies) - 1, int(p * len(latencies)))] if latencies else None


print(json.dumps({
    "throughput": len(rows) / span if span > 0 else 0.0,
    "requests": len(rows),
    "errors": len(bad),
    "error_kinds": sorted({r[1] for r in bad}),
    "granted": None,
    "latency_us": {"p50": pct(0.5), "p90": pct(0.9), "p99": pct(0.99), "p999": pct(0.999)},
}))
