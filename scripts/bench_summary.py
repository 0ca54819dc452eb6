"""What the bench scripts' summaries share (bench-http.sh, bench-grpc.sh,
bench-tail.sh): reading their runs and printing a median with its range.

The scripts run from the repository's root and import this with
`sys.path.insert(0, "scripts")`.
"""
import json
import statistics


def load_runs(path):
    """The runs of a results file (one JSON object per line), without the
    failed ones; says how many were left out, so no figure hides them."""
    runs = [json.loads(line) for line in open(path)]
    failed = [r for r in runs if r.get("failed")]
    if failed:
        print(f"({len(failed)} failed runs left out of what follows)")
    return [r for r in runs if not r.get("failed")]


def span(values, fmt=lambda v: f"{v:,.0f}"):
    """`median [min-max]` of the values that are not None, each written by
    `fmt`; `-` when there are none."""
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    return f"{fmt(statistics.median(values))} [{fmt(min(values))}-{fmt(max(values))}]"
