#!/usr/bin/env bash
# workers_bench.sh - rebound --workers 1 against --workers 2 on the pump.
#
#   bench/workers_bench.sh [--rounds N] [--clients C] [--messages M]
#
# bench/fake_broker floods basic.deliver + content header + 256-byte body
# to every consumer. C pump_clients at once each consume M deliveries
# (no-ack, --messages: counted from consume-ok, so nothing depends on a
# warm-up) through a rebound started with --workers W, W alternating 1, 2
# (2, 1 the next round). Reported per W: frames/s (every client's frames
# over the wall time from the first start to the last exit) and CPU
# microseconds per 1,000 frames (utime+stime of every rebound process over
# the same span). No pinning: the point is whether a second worker lets
# rebound use the second core. Defaults: 3 rounds, 4 clients, 2,000,000
# messages each.
set -euo pipefail
. "$(dirname "$0")/bench_lib.sh"

ROUNDS=3 CLIENTS=4 MESSAGES=2000000
while [ $# -gt 0 ]; do
    case $1 in
        --rounds) ROUNDS=$2; shift 2 ;;
        --clients) CLIENTS=$2; shift 2 ;;
        --messages) MESSAGES=$2; shift 2 ;;
        *) die "usage: $0 [--rounds N] [--clients C] [--messages M]" ;;
    esac
done

build rebound fake_broker pump_client
FAKE_PORT=$(free_port)
"$BUILD/bench/fake_broker" --listen "127.0.0.1:$FAKE_PORT" --timeout 3600 \
    >"$WORK/fake.out" 2>"$WORK/fake.log" &
FAKE_PID=$!
PIDS+=("$FAKE_PID")
wait_port "$FAKE_PORT" "$FAKE_PID"
RESULTS=$WORK/results.txt
: >"$RESULTS"

# ticks of rebound and its workers (the children of $1)
all_ticks() {
    local sum=0 p
    for p in "$1" $(pgrep -P "$1" || true); do
        sum=$((sum + $(cpu_ticks "$p")))
    done
    echo "$sum"
}

run() { # WORKERS ROUND
    local w=$1 i t0 t1 c0 c1 frames=0 line pids=()
    REBOUND_ARGS="--admin off --log-level info --workers $w" start_rebound "$FAKE_PORT"
    wait_until_workers "$w"
    c0=$(all_ticks "$REBOUND_PID")
    t0=$(date +%s%N)
    for ((i = 0; i < CLIENTS; i++)); do
        "$BUILD/bench/pump_client" --port "$REBOUND_PORT" --label "W$w" \
            --messages "$MESSAGES" --seconds 120 >"$WORK/client.$i" &
        pids+=($!)
    done
    for i in "${pids[@]}"; do wait "$i" || true; done
    t1=$(date +%s%N)
    c1=$(all_ticks "$REBOUND_PID")
    for ((i = 0; i < CLIENTS; i++)); do
        line=$(grep '^RESULT' "$WORK/client.$i") || die "client $i: no result"
        case $line in *status=ok*) ;; *) die "client $i: $line" ;; esac
        frames=$((frames + $(sed 's/.* frames=\([0-9]*\).*/\1/' <<<"$line")))
    done
    kill -TERM "$REBOUND_PID"
    wait "$REBOUND_PID" || true
    echo "RESULT workers=$w round=$2 frames=$frames ns=$((t1 - t0)) ticks=$((c1 - c0))" |
        tee -a "$RESULTS"
}

# every worker of $REBOUND_PID listening (its log says so, one line each)
wait_until_workers() {
    local i
    for ((i = 0; i < 100; i++)); do
        [ "$(grep -c 'msg=listening' "$WORK/rebound.log")" -ge "$1" ] && return 0
        sleep 0.05
    done
    die "rebound --workers $1 did not start its workers"
}

describe_machine
echo "# $CLIENTS clients x $MESSAGES deliveries of 256 B (3 frames each), no-ack; no pinning"
echo "# loadavg before: $(cut -d" " -f1-3 /proc/loadavg)"
for ((round = 1; round <= ROUNDS; round++)); do
    wait_quiet 60
    if ((round % 2)); then run 1 "$round"; run 2 "$round"; else run 2 "$round"; run 1 "$round"; fi
done

"$PY" - "$RESULTS" "$(getconf CLK_TCK)" <<'EOF'
import statistics as st, sys
runs = [dict(f.split("=", 1) for f in l.split()[1:]) for l in open(sys.argv[1])]
hz = int(sys.argv[2])
print()
print("workers | frames/s (M) median (runs) | rebound CPU us per 1000 frames median (runs) | cores used")
for w in ("1", "2"):
    rs = [r for r in runs if r["workers"] == w]
    fps = [int(r["frames"]) / (int(r["ns"]) / 1e9) for r in rs]
    cpu = [int(r["ticks"]) / hz * 1e6 / int(r["frames"]) * 1000 for r in rs]
    cores = [int(r["ticks"]) / hz / (int(r["ns"]) / 1e9) for r in rs]
    print(f"{w:7} | {st.median(fps)/1e6:.2f} ({' / '.join(f'{x/1e6:.2f}' for x in fps)}) "
          f"| {st.median(cpu):.1f} ({' / '.join(f'{x:.1f}' for x in cpu)}) "
          f"| {st.median(cores):.2f}")
EOF
