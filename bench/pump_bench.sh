#!/usr/bin/env bash
# pump_bench.sh - rebound's own forwarding ceiling, without a broker.
#
#   bench/pump_bench.sh [--rounds N] [--seconds T] [--profile]
#                       [--body-size B] [--splice]
#
# bench/fake_broker floods basic.deliver + content header + 256-byte body
# (--body-size B: B bytes)
# to whoever consumes; bench/pump_client consumes with no-ack and counts
# frames and bytes for T seconds (after 1 s of warm-up). Pinned with
# taskset: fake_broker and pump_client share core 1, the proxy under test
# runs alone on core 0. Each round runs direct (D: client <- fake), through
# HAProxy (H, TCP mode, one thread: the reference) and through rebound (R),
# the order rotated per round. pump_client reads the proxy's utime+stime
# (/proc/PID/stat) at the start and end of its counted window: CPU seconds
# per million frames, and the share of core 0 the proxy used. When that
# share is below 1 the proxy is not the bottleneck (core 1 is) and its
# ceiling on one core is at least frames/s / share (an extrapolation).
# --splice: a fourth target, S: HAProxy with option splice-request and
# splice-response (payload moved socket to socket through a pipe with
# splice(2), never copied to user space): what rebound could gain on
# large frames by doing the same.
# --profile: one more rebound run under `perf record -e cpu-clock -g`,
# and the top symbols. Defaults: 3 rounds of 5 s (about 1 min).
set -euo pipefail
. "$(dirname "$0")/bench_lib.sh"

ROUNDS=3 SECONDS_=5 PROFILE=0 BODY=256 SPLICE=0
while [ $# -gt 0 ]; do
    case $1 in
        --rounds) ROUNDS=$2; shift 2 ;;
        --seconds) SECONDS_=$2; shift 2 ;;
        --profile) PROFILE=1; shift ;;
        --body-size) BODY=$2; shift 2 ;;
        --splice) SPLICE=1; shift ;;
        *) die "usage: $0 [--rounds N] [--seconds T] [--profile] [--body-size B] [--splice]" ;;
    esac
done
[ "$(nproc)" -ge 2 ] || die "needs 2 cores (pinning: proxy on 0, fake+client on 1)"

build rebound fake_broker pump_client
FAKE_PORT=$(free_port)
taskset -c 1 "$BUILD/bench/fake_broker" --listen "127.0.0.1:$FAKE_PORT" \
    --body-size "$BODY" --timeout 900 >"$WORK/fake.out" 2>"$WORK/fake.log" &
FAKE_PID=$!
PIDS+=("$FAKE_PID")
wait_port "$FAKE_PORT" "$FAKE_PID"
log "fake_broker pid $FAKE_PID on 127.0.0.1:$FAKE_PORT (core 1)"
TARGETS=(D H R)
if [ "$SPLICE" = 1 ]; then
    # pipes count against the descriptor limit: a few are enough here
    HAPROXY_GLOBAL='    maxpipes 64' \
        HAPROXY_OPTIONS=$'    option splice-request\n    option splice-response' \
        start_haproxy "$FAKE_PORT" 0
    SPLICE_PORT=$HAPROXY_PORT SPLICE_PID=$HAPROXY_PID
    TARGETS=(D H S R)
fi
start_haproxy "$FAKE_PORT" 0
start_rebound "$FAKE_PORT" 0
RESULTS=$WORK/results.txt
: >"$RESULTS"

run() { # TARGET ROUND
    local port pid line
    case $1 in
        D) port=$FAKE_PORT pid=$FAKE_PID ;;
        H) port=$HAPROXY_PORT pid=$HAPROXY_PID ;;
        R) port=$REBOUND_PORT pid=$REBOUND_PID ;;
        S) port=$SPLICE_PORT pid=$SPLICE_PID ;;
    esac
    line=$(taskset -c 1 "$BUILD/bench/pump_client" --port "$port" --label "$1" \
        --seconds "$SECONDS_" --warmup 1 --cpu-pid "$pid" | grep '^RESULT') || true
    echo "$line round=$2" | tee -a "$RESULTS"
    sleep 0.5 # let the proxy drop the flood it still holds
}

order() {
    local t=("${TARGETS[@]}") k=$(( ($1 - 1) % ${#TARGETS[@]} ))
    echo "${t[@]:k} ${t[@]:0:k}"
}

describe_machine
echo "# pinning: proxy on core 0; fake_broker and pump_client on core 1; body $BODY B"
echo "# loadavg before: $(cut -d" " -f1-3 /proc/loadavg)"
for ((round = 1; round <= ROUNDS; round++)); do
    wait_quiet 60
    for t in $(order "$round"); do
        run "$t" "$round"
    done
done

"$PY" - "$RESULTS" <<'EOF'
import statistics as st, sys
runs = []
for line in open(sys.argv[1]):
    runs.append(dict(f.split("=", 1) for f in line.split()[1:] if "=" in f))
names = {"D": "direct", "H": "HAProxy", "S": "HAProxy+splice", "R": "rebound"}
def vals(t, k):
    return [float(r[k]) for r in runs if r.get("label") == t and r.get("status") == "ok"]
d = st.median(vals("D", "frames_per_s"))
print()
print("target         | frames/s (M) median | MB/s median | x direct | proxy CPU s per 1M frames | core-0 share | frames/s / share (M)")
for t in "DHSR":
    fps, mbs = vals(t, "frames_per_s"), vals(t, "MB_per_s")
    if not fps:
        if t != "S":
            print(f"{names[t]:14} | no complete run")
        continue
    line = (f"{names[t]:14} | {st.median(fps)/1e6:6.2f} ({' / '.join(f'{x/1e6:.2f}' for x in fps)}) "
            f"| {st.median(mbs):7.0f} | {st.median(fps)/d:8.3f}")
    if t != "D":
        cpu, util = vals(t, "cpu_s_per_mframes"), vals(t, "core_util")
        line += (f" | {st.median(cpu):.4f} ({' / '.join(f'{x:.4f}' for x in cpu)})"
                 f" | {st.median(util):.2f} | {st.median(fps)/st.median(util)/1e6:6.1f}")
    print(line)
EOF

if [ "$PROFILE" = 1 ]; then
    if ! perf record -e cpu-clock -o "$WORK/perf.probe" -- true >/dev/null 2>&1; then
        log "perf record does not work here; no profile"
        exit 0
    fi
    log "profiling rebound (perf record -e cpu-clock -g) during one more run"
    perf record -e cpu-clock -g -p "$REBOUND_PID" -o "$WORK/perf.data" \
        -- sleep "$SECONDS_" >/dev/null 2>&1 &
    PERF_PID=$!
    taskset -c 1 "$BUILD/bench/pump_client" --port "$REBOUND_PORT" --label R-profiled \
        --seconds "$SECONDS_" --warmup 0 --cpu-pid "$REBOUND_PID" | grep '^RESULT' || true
    wait "$PERF_PID" || true
    echo
    echo "# rebound profile, by shared object:"
    perf report -i "$WORK/perf.data" --no-children --stdio -g none --sort dso 2>/dev/null |
        grep -v '^#' | grep -v '^$' | head -n 6
    echo "# top symbols:"
    perf report -i "$WORK/perf.data" --no-children --stdio -g none --sort dso,sym 2>/dev/null |
        grep -v '^#' | grep -v '^$' | head -n 25
fi
