#!/bin/sh
# Instructions per decision of the memory store for every algorithm, through
# `decide_limit` and through a one-item plan, counted by callgrind (which
# does not depend on what else the machine runs). See docs/benchmarks.md.
#
#   crates/store/benches/instructions.sh [decisions]    # default 100000
#
# Needs valgrind. Builds the `instructions` example with the bench profile.
set -eu
n="${1:-100000}"
target="${CARGO_TARGET_DIR:-target}"
cargo build --quiet --profile bench -p tollgate-store --example instructions
bin="$target/release/examples/instructions"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
names="$("$bin" 2>&1 | sed -n 's/^algorithms: //p')"
printf '| algorithm | decide_limit | one-item plan | granted |\n|---|---:|---:|---|\n'
for name in $names; do
    row="| $name"
    for path in limit plan; do
        valgrind --tool=callgrind --callgrind-out-file="$out/$name.$path" \
            --toggle-collect='instructions::measured' \
            "$bin" "$name" "$path" "$n" >"$out/$name.$path.log" 2>/dev/null
        total="$(sed -n 's/^totals: *//p' "$out/$name.$path")"
        row="$row | $(python3 -c "print(f'{$total / $n:.0f}')")"
    done
    granted="$(cut -d: -f2 "$out/$name.plan.log")"
    echo "$row |$granted |"
done
