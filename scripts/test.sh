#!/usr/bin/env bash
# Runs every test of tollgate: formatting, lints, unit, property and
# end-to-end tests. Installs what the tests need when it is missing
# (redis-server, PostgreSQL, Chromium, jq, curl and openssl, from Debian's packages), so it works on a
# fresh Debian machine with only the Rust toolchain. The tests start their
# own servers on free loopback ports; nothing here starts a service.
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

need_package() {
    # $1: a command the tests run; $2: the Debian package that has it.
    if ! command -v "$1" >/dev/null 2>&1; then
        echo "== installing $2 (for $1)"
        local sudo=""
        if [ "$(id -u)" != 0 ]; then sudo="sudo"; fi
        $sudo apt-get update -qq
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "$2" >/dev/null
    fi
}
# The Redis store's tests run real redis-server processes.
need_package redis-server redis-server
# The configuration API's tests run real PostgreSQL servers (initdb and
# postgres). Debian's postgresql package puts them in
# /usr/lib/postgresql/VERSION/bin/, not on the PATH, so look there as well.
have_postgres() {
    command -v initdb >/dev/null 2>&1 && return 0
    local bin
    for bin in /usr/lib/postgresql/*/bin/initdb; do
        if [ -x "$bin" ]; then return 0; fi
    done
    return 1
}
have_postgres || need_package initdb postgresql
# The configuration API's web page is tested in a real headless Chromium
# (crates/tollgate/tests/config_api_ui.rs). Debian names it `chromium`;
# other distributions `chromium-browser`, which will do as well.
command -v chromium-browser >/dev/null 2>&1 || need_package chromium chromium
# scripts/chaos.sh (the fault-injection suite over many seeds) sums its
# report with jq.
need_package jq jq
# The docs' examples (crates/tollgate/tests/docs/) run as a reader runs
# them: with curl and openssl.
need_package curl curl
need_package openssl openssl


echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets --locked --features tollgate/png -- -D warnings
echo "== cargo test"
cargo test --workspace --locked --features tollgate/png
