#!/usr/bin/env bash
# Runs every test of tollgate: formatting, lints, unit, property and
# end-to-end tests. Installs what the tests need when it is missing (later
# issues add redis-server and PostgreSQL here), so it works on a fresh Debian
# machine with only the Rust toolchain.
set -euo pipefail
cd "$(dirname "$0")/.."

need_component() {
    # rustfmt and clippy ship with rustup's default profile; add them if not.
    if ! cargo "$1" --version >/dev/null 2>&1; then
        rustup component add "$2"
    fi
}
need_component fmt rustfmt
need_component clippy clippy

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings
echo "== cargo test"
cargo test --workspace --locked
