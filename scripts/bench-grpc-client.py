#!/usr/bin/env python3
"""A gRPC load generator that is not part of tollgate (scripts/bench-grpc.sh).

Python's grpcio (the C core under asyncio): CONCURRENCY coroutines, each
sending its next unary call when the previous one is answered (closed
loop), over one channel (HTTP/2 multiplexes them). The requests are those
`tollgate bench` sends: Envoy's ShouldRateLimit with domain DOMAIN and one
descriptor DESCRIPTOR_KEY=user-N (hits_addend 1), or tollgate's native
Request for NAMESPACE/RESOURCE, domain user-N, hits 1, min_hits 1. user-N is
drawn uniformly from KEYS (1: always user-0).

The message classes are generated at run time from the repository's .proto
files with grpcio-tools, into a temporary directory (nothing generated is
kept). Requests are encoded once per key before the run and sent as bytes;
answers are decoded and counted: granted (OK / allowed), rejected
(OVER_LIMIT / not allowed), errors by kind (a status that is not OK, an
UNKNOWN overall code, a timeout). Prints one JSON document.

Usage: bench-grpc-client.py --target HOST:PORT --api rls|native [--keys N]
       [--concurrency C] [--duration S] [--warmup S] [--proto-dir DIR]
       bench-grpc-client.py --api rls|native --target - --write-body FILE
       bench-grpc-client.py --api rls|native --target HOST:PORT --check
"""

import argparse
import asyncio
import importlib
import json
import os
import random
import sys
import tempfile
import time


def generate(proto_dir, out):
    """The Python message modules of the two services, in `out`."""
    from grpc_tools import protoc
    import grpc_tools

    include = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    files = []
    for root, _, names in os.walk(proto_dir):
        files += [os.path.relpath(os.path.join(root, n), proto_dir) for n in names if n.endswith(".proto")]
    rc = protoc.main(["protoc", f"-I{proto_dir}", f"-I{include}", f"--python_out={out}"] + sorted(files))
    if rc != 0:
        sys.exit(f"protoc failed ({rc}) on the .proto files of {proto_dir}")
    sys.path.insert(0, out)
    rls = importlib.import_module("envoy.service.ratelimit.v3.rls_pb2")
    native = importlib.import_module("tollgate.v1.tollgate_pb2")
    return rls, native


def percentile(sorted_values, p):
    if not sorted_values:
        return 0.0
    i = min(len(sorted_values) - 1, int(round(p / 100.0 * (len(sorted_values) - 1))))
    return sorted_values[i]


async def run(args, rls, native):
    import grpc

    if args.api == "rls":
        method = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
        over_limit = rls.RateLimitResponse.OVER_LIMIT
        ok = rls.RateLimitResponse.OK

        def encode(k):
            req = rls.RateLimitRequest(domain=args.domain_name, hits_addend=1)
            entry = req.descriptors.add().entries.add()
            entry.key = args.descriptor_key
            entry.value = f"user-{k}"
            return req.SerializeToString()

        def outcome(raw):
            code = rls.RateLimitResponse.FromString(raw).overall_code
            if code == ok:
                return "granted"
            if code == over_limit:
                return "rejected"
            return "overall_code " + rls.RateLimitResponse.Code.Name(code)

    else:
        method = "/tollgate.v1.Tollgate/Request"

        def encode(k):
            return native.RateRequest(
                namespace=args.namespace, resource=args.resource, domain=f"user-{k}", hits=1, min_hits=1
            ).SerializeToString()

        def outcome(raw):
            return "granted" if native.RateResponse.FromString(raw).allowed else "rejected"

    if args.write_body:
        # h2load's body: the 5-byte gRPC frame prefix (not compressed,
        # length big-endian) and the message for user-0.
        msg = encode(0)
        with open(args.write_body, "wb") as f:
            f.write(b"\x00" + len(msg).to_bytes(4, "big") + msg)
        return None

    bodies = [encode(k) for k in range(args.keys)]
    channel = grpc.aio.insecure_channel(args.target)
    # Bytes in, bytes out: the (de)serialisation is ours, done above and in
    # `outcome`, so grpcio's per-call Python work is only the call itself.
    call = channel.unary_unary(method, request_serializer=None, response_deserializer=None)
    try:
        await asyncio.wait_for(channel.channel_ready(), timeout=5)
    except asyncio.TimeoutError:
        sys.exit(f"cannot connect to {args.target} within 5 s")

    if args.check:
        # One call for user-0: what the server makes of the request h2load
        # sends (h2load itself never reads grpc-status).
        try:
            kind = outcome(await call(bodies[0], timeout=args.timeout))
        except grpc.aio.AioRpcError as e:
            kind = "status " + e.code().name
        await channel.close()
        return {"check": args.api, "target": args.target, "outcome": kind}

    counts = {}
    latencies = []
    state = {"measuring": False, "stop": False}

    async def worker(seed):
        rng = random.Random(seed)
        n = len(bodies)
        while not state["stop"]:
            body = bodies[rng.randrange(n)] if n > 1 else bodies[0]
            t0 = time.perf_counter()
            try:
                raw = await call(body, timeout=args.timeout)
                kind = outcome(raw)
            except grpc.aio.AioRpcError as e:
                kind = "status " + e.code().name
            t1 = time.perf_counter()
            if state["measuring"]:
                counts[kind] = counts.get(kind, 0) + 1
                latencies.append(t1 - t0)

    tasks = [asyncio.create_task(worker(args.seed + i)) for i in range(args.concurrency)]
    await asyncio.sleep(args.warmup)
    state["measuring"] = True
    start = time.perf_counter()
    cpu0 = time.process_time()
    await asyncio.sleep(args.duration)
    state["measuring"] = False
    elapsed = time.perf_counter() - start
    cpu = time.process_time() - cpu0
    state["stop"] = True
    await asyncio.gather(*tasks)
    await channel.close()

    requests = sum(counts.values())
    latencies.sort()
    us = lambda s: round(s * 1e6, 1)
    return {
        "client": f"python grpcio {grpc.__version__} (asyncio)",
        "api": args.api,
        "target": args.target,
        "concurrency": args.concurrency,
        "keys": args.keys,
        "duration_s": round(elapsed, 3),
        "requests": requests,
        "granted": counts.get("granted", 0),
        "rejected": counts.get("rejected", 0),
        "errors": requests - counts.get("granted", 0) - counts.get("rejected", 0),
        "error_kinds": {k: v for k, v in counts.items() if k not in ("granted", "rejected")},
        "throughput": round(requests / elapsed, 1) if elapsed > 0 else 0.0,
        "latency_us": {p: us(percentile(latencies, q)) for p, q in (("p50", 50), ("p90", 90), ("p99", 99), ("p999", 99.9))},
        "client_cpu_us_per_request": round(cpu * 1e6 / requests, 1) if requests else None,
    }


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--target", required=True)
    p.add_argument("--api", choices=("rls", "native"), required=True)
    p.add_argument("--keys", type=int, default=1)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--duration", type=float, default=5.0)
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument("--timeout", type=float, default=5.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--domain-name", default="bench-rls")
    p.add_argument("--descriptor-key", default="user")
    p.add_argument("--namespace", default="bench")
    p.add_argument("--resource", default="gcra")
    p.add_argument("--proto-dir", default=os.path.join(here, "..", "proto"))
    p.add_argument("--write-body", metavar="FILE", help="write the framed request for user-0 to FILE (for h2load) and exit")
    p.add_argument("--check", action="store_true", help="send one request for user-0 and print what it was answered")
    p.add_argument("--gen-dir", help="generate the modules here (default: a temporary directory)")
    args = p.parse_args()
    if args.keys < 1 or args.concurrency < 1 or args.duration <= 0:
        sys.exit("--keys and --concurrency must be at least 1, --duration above 0")
    try:
        import grpc  # noqa: F401
        import grpc_tools  # noqa: F401
    except ImportError as e:
        sys.exit(f"{e.name} is missing: pip install grpcio grpcio-tools")
    with tempfile.TemporaryDirectory(prefix="bench-grpc-py.") as tmp:
        out = args.gen_dir or tmp
        rls, native = generate(os.path.abspath(args.proto_dir), out)
        report = asyncio.run(run(args, rls, native))
    if report is None:
        return
    json.dump(report, sys.stdout)
    print()
    if args.check:
        if report["outcome"] not in ("granted", "rejected"):
            sys.exit(f"{args.target} answered {args.api} with {report['outcome']}")
        return
    if report["requests"] == 0:
        sys.exit("no call was answered within the measured window")


if __name__ == "__main__":
    main()
