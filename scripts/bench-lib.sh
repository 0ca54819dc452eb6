# Shared by the pinned server benchmarks (scripts/bench-http.sh,
# scripts/bench-grpc.sh, scripts/bench-tail.sh; docs/benchmarks.md, "Side by
# side, pinned"). Sourced, not run.
#
# Pinning: the servers run on CPU $SERVER_CPU (default 0), every load
# generator on $CLIENT_CPU (default 1), so that each has one core of its own
# and the two do not take turns on the same one.

SERVER_CPU=${SERVER_CPU:-0}
CLIENT_CPU=${CLIENT_CPU:-1}
HZ=$(getconf CLK_TCK)
FAILED=0

die() { echo "error: $*" >&2; exit 2; }

# need TOOL HOW: stop with HOW to get TOOL when it is missing.
need() { command -v "$1" >/dev/null || die "$1 is missing ($2)"; }

check_pinning() {
    need taskset "apt-get install util-linux"
    local cpus
    cpus=$(nproc --all)
    ((SERVER_CPU < cpus && CLIENT_CPU < cpus)) ||
        die "SERVER_CPU=$SERVER_CPU / CLIENT_CPU=$CLIENT_CPU: this machine has CPUs 0..$((cpus - 1))"
    [[ "$SERVER_CPU" != "$CLIENT_CPU" ]] || die "SERVER_CPU and CLIENT_CPU must differ"
}

# Only in the background (`on_server_cpu cmd &`): it replaces the subshell,
# so that $! is the server's own pid, whose CPU time is read from /proc.
on_server_cpu() { exec taskset -c "$SERVER_CPU" "$@"; }
on_client_cpu() { taskset -c "$CLIENT_CPU" "$@"; }

# The tollgate binary: $TOLLGATE, or built here in release.
tollgate_binary() {
    if [[ -z "${TOLLGATE:-}" ]]; then
        cargo build --release --locked -p tollgate >&2
        TOLLGATE="${CARGO_TARGET_DIR:-target}/release/tollgate"
    fi
    [[ -x "$TOLLGATE" ]] || die "TOLLGATE=$TOLLGATE is not an executable"
    TOLLGATE=$(readlink -f "$TOLLGATE")
}

# What was measured: the binary, its version, the checkout's commit.
describe_build() {
    local commit
    commit=$(git describe --always --dirty --abbrev=12 2>/dev/null || echo "not a git checkout")
    echo "tollgate:   $TOLLGATE ($("$TOLLGATE" --version 2>/dev/null | head -1)), built $(date -r "$TOLLGATE" '+%F %T')"
    echo "checkout:   $(pwd) at $commit$([[ -n "${TOLLGATE_GIVEN:-}" ]] && echo ' (TOLLGATE was given: the binary may be of another commit)')"
    echo "pinning:    servers on CPU $SERVER_CPU, load generators on CPU $CLIENT_CPU ($(nproc --all) CPUs, $(uname -r))"
    echo "date:       $(date '+%F %T %Z'), load average $(cut -d' ' -f1-3 /proc/loadavg)"
}

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# wait_for_log FILE PATTERN PID: until FILE has PATTERN; fails if PID died.
wait_for_log() {
    local i
    for i in $(seq 1 100); do
        grep -qs "$2" "$1" && return 0
        kill -0 "$3" 2>/dev/null || { cat "$1" >&2; die "the server (pid $3) exited while starting"; }
        sleep 0.1
    done
    cat "$1" >&2
    die "no '$2' in $1 after 10 s"
}

# wait_for_port PORT PID
wait_for_port() {
    local i
    for i in $(seq 1 100); do
        (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
        kill -0 "$2" 2>/dev/null || die "the server (pid $2) exited while starting"
        sleep 0.1
    done
    die "nothing listens on 127.0.0.1:$1 after 10 s"
}

# CPU accounting around a run, in clock ticks: a process's own time
# (all its threads), the time of this shell's reaped children (the load
# generator, once its command substitution has returned), and the whole
# machine's busy time. `others` is what neither the server nor the load
# generator used: anything else running spoils the run, and shows there.
proc_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
children_ticks() { awk '{ print $16 + $17 }' "/proc/$$/stat"; }
machine_ticks() { awk '/^cpu / { print $2 + $3 + $4 + $7 + $8 + $9 }' /proc/stat; }

# cpu_start SERVER_PID / cpu_stop: sets CPU_SERVER, CPU_CLIENT, CPU_OTHERS
# (each in % of one CPU over the wall time between them), and
# CPU_SERVER_TICKS and CPU_WALL (seconds).
cpu_start() {
    _cpu_pid=$1
    _s0=$(proc_ticks "$1")
    _c0=$(children_ticks)
    _m0=$(machine_ticks)
    _t0=$(date +%s.%N)
}
cpu_stop() {
    local s1 c1 m1 t1
    s1=$(proc_ticks "$_cpu_pid")
    c1=$(children_ticks)
    m1=$(machine_ticks)
    t1=$(date +%s.%N)
    CPU_SERVER_TICKS=$((s1 - _s0))
    read -r CPU_SERVER CPU_CLIENT CPU_OTHERS CPU_WALL < <(python3 -c "
wall = ($t1 - $_t0) * $HZ
s, c, m = $s1 - $_s0, $c1 - $_c0, $m1 - $_m0
pct = lambda x: round(100 * x / wall)
print(pct(s), pct(c), max(0, pct(m - s - c)), round(wall / $HZ, 3))")
}

# fail MESSAGE: remember that a run went wrong (the script exits 1 at the
# end, after printing everything it measured).
fail() {
    echo "FAILED: $*" >&2
    FAILED=1
}

# A scratch directory and the processes of this run, both gone at exit.
# Sets `work` and `pids` (add each started process to it).
start_work() {
    work=$(mktemp -d)
    pids=()
    trap cleanup EXIT
    trap "exit 130" INT TERM
}
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    rm -rf "$work"
}

# `tollgate serve` on the server CPU with scripts/bench-config/, in the
# background: sets SERVE (its pid), once it serves SERVE_GRPC and SERVE_HTTP.
start_serve() {
    on_server_cpu "$TOLLGATE" serve --grpc 127.0.0.1:0 --http 127.0.0.1:0 --config scripts/bench-config/ \
        2>"$work/serve.log" &
    SERVE=$!
    pids+=("$SERVE")
}
serve_addresses() {
    wait_for_log "$work/serve.log" 'http=' "$SERVE"
    SERVE_GRPC=$(grep -o 'grpc=[0-9.:]*' "$work/serve.log" | head -1 | cut -d= -f2)
    SERVE_HTTP=$(grep -o 'http=[0-9.:]*' "$work/serve.log" | head -1 | cut -d= -f2)
}

# `tollgate serve` and `tollgate bench-echo` (the no-op gRPC ceiling),
# both on the server CPU: sets SERVE, ECHO, SERVE_GRPC, SERVE_HTTP and
# ECHO_GRPC.
start_serve_and_echo() {
    start_serve
    on_server_cpu "$TOLLGATE" bench-echo --grpc 127.0.0.1:0 2>"$work/echo.log" &
    ECHO=$!
    pids+=("$ECHO")
    serve_addresses
    wait_for_log "$work/echo.log" 'grpc=' "$ECHO"
    ECHO_GRPC=$(grep -o 'grpc=[0-9.:]*' "$work/echo.log" | head -1 | cut -d= -f2)
}
