#!/usr/bin/env bash
# idle_bench.sh - memory per idle AMQP connection, rebound vs HAProxy.
#
#   bench/idle_bench.sh [--count N] [--cycles C] [--no-channel]
#
# Starts a private broker, rebound and HAProxy (TCP mode, one thread) in
# front of it. For each proxy, bench/idle_conns opens --count connections
# (default 1000) through it, each with the full handshake (PLAIN login,
# heartbeat 0, vhost /) and channel 1 open, and keeps them idle. The
# proxy's VmRSS (/proc/PID/status) is read before, at half, at --count and
# after closing them all; this is repeated --cycles times (default 2: a
# second cycle shows whether memory comes back or keeps growing); VmData
# (heap and other private mappings) before and after each cycle too.
# KiB per connection = (RSS at N - RSS before) / N, and the marginal cost
# (RSS at N - RSS at N/2) / (N/2), which leaves out one-time costs.
set -euo pipefail
. "$(dirname "$0")/bench_lib.sh"

COUNT=1000 CYCLES=2 CHANNEL=--channel
while [ $# -gt 0 ]; do
    case $1 in
        --count) COUNT=$2; shift 2 ;;
        --cycles) CYCLES=$2; shift 2 ;;
        --no-channel) CHANNEL=; shift ;;
        *) die "usage: $0 [--count N] [--cycles C] [--no-channel]" ;;
    esac
done
HALF=$((COUNT / 2))
# rebound holds two sockets per connection, the client one more each
need=$((2 * COUNT + 200))
if [ "$(ulimit -n)" -lt "$need" ]; then
    ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
    [ "$(ulimit -n)" -ge "$need" ] || die "ulimit -n is $(ulimit -n), need $need"
fi
log "ulimit -n $(ulimit -n)"

build rebound idle_conns
start_broker
start_rebound "$BROKER_PORT"
start_haproxy "$BROKER_PORT"
RESULTS=$WORK/results.txt
: >"$RESULTS"

vmdata_kib() { awk '/^VmData:/ {print $2}' "/proc/$1/status"; }

# measure NAME PID PORT CYCLE
measure() {
    local name=$1 pid=$2 port=$3 cycle=$4 line r0 rh rn rc d0
    r0=$(rss_kib "$pid")
    d0=$(vmdata_kib "$pid")
    coproc IDLE { "$BUILD/bench/idle_conns" --port "$port" --count "$COUNT" \
        --checkpoints "$HALF" --hold 120 $CHANNEL 2>"$WORK/idle.log"; }
    read -r -t 120 line <&"${IDLE[0]}" || die "idle_conns: no answer"
    [[ $line == OPEN* ]] || { cat "$WORK/idle.log" >&2; die "idle_conns: $line"; }
    sleep 1 # the proxy finishes its side (rebound's own channel, ...)
    rh=$(rss_kib "$pid")
    echo go >&"${IDLE[1]}"
    read -r -t 120 line <&"${IDLE[0]}" || die "idle_conns: no answer"
    [[ $line == OPEN* ]] || { cat "$WORK/idle.log" >&2; die "idle_conns: $line"; }
    local secs=${line##*secs=}
    sleep 1
    rn=$(rss_kib "$pid")
    echo go >&"${IDLE[1]}"
    wait "$IDLE_PID" 2>/dev/null || true
    sleep 2 # the proxy closes its upstream connections
    rc=$(rss_kib "$pid")
    echo "RESULT proxy=$name cycle=$cycle conns=$COUNT open_secs=$secs rss_before_kib=$r0 rss_half_kib=$rh rss_all_kib=$rn rss_after_close_kib=$rc vmdata_before_kib=$d0 vmdata_after_close_kib=$(vmdata_kib "$pid")" | tee -a "$RESULTS"
}

describe_machine
echo "# $COUNT connections, ${CHANNEL:+channel 1 open on each, }heartbeat 0"
for ((c = 1; c <= CYCLES; c++)); do
    measure rebound "$REBOUND_PID" "$REBOUND_PORT" "$c"
    measure haproxy "$HAPROXY_PID" "$HAPROXY_PORT" "$c"
done

"$PY" - "$RESULTS" "$COUNT" "$HALF" <<'EOF'
import sys
n, half = int(sys.argv[2]), int(sys.argv[3])
print()
print("proxy   | cycle | RSS KiB before / half / all / after close | KiB per conn (all-before)/N | marginal (all-half)/(N-half) | VmData KiB before / after close")
for line in open(sys.argv[1]):
    r = dict(f.split("=", 1) for f in line.split()[1:])
    b, h, a, c = (int(r[k]) for k in ("rss_before_kib", "rss_half_kib", "rss_all_kib", "rss_after_close_kib"))
    print(f"{r['proxy']:7} | {r['cycle']:5} | {b:6} / {h:6} / {a:6} / {c:6}          | "
          f"{(a - b) / n:27.2f} | {(a - h) / (n - half):10.2f} | "
          f"{r['vmdata_before_kib']} / {r['vmdata_after_close_kib']}")
EOF
