#!/usr/bin/env bash
# proxy_bench.sh - rebound against a real RabbitMQ, with direct and HAProxy
# (TCP mode) as references measured in the same run.
#
#   bench/proxy_bench.sh [--rounds N] [--lat-rounds N] [--count N] [--rate R]
#                        [--duration S]
#
# Builds rebound and bench/amqp_load (Release), starts a private broker,
# HAProxy (one thread, no logging) and rebound, then runs the same load
# generator direct (D), through HAProxy (H) and through rebound (R),
# alternating: each round runs D, H and R once, the order rotated from
# round to round (DHR, HRD, RDH, ...). First the throughput rounds
# (--count messages of 256 B, confirms with 256 outstanding, a consumer with
# manual acks and prefetch 500), then the latency rounds (--rate msg/s for
# --duration s after 1 s of warm-up). CPU time (utime+stime from
# /proc/PID/stat) of rebound and of HAProxy is read before and after every
# run. Prints every run, then a summary table. Stops all it started on exit.
# Defaults: 5 throughput rounds of 150000 messages, 3 latency rounds at
# 2000 msg/s for 10 s (about 4 min with the broker's start). The broker is
# warmed up first (100000 messages per target, not counted): a fresh node is
# slower for its first minute.
set -euo pipefail
. "$(dirname "$0")/bench_lib.sh"

ROUNDS=5 LAT_ROUNDS=3 COUNT=150000 RATE=2000 DURATION=10
while [ $# -gt 0 ]; do
    case $1 in
        --rounds) ROUNDS=$2; shift 2 ;;
        --lat-rounds) LAT_ROUNDS=$2; shift 2 ;;
        --count) COUNT=$2; shift 2 ;;
        --rate) RATE=$2; shift 2 ;;
        --duration) DURATION=$2; shift 2 ;;
        *) die "usage: $0 [--rounds N] [--lat-rounds N] [--count N] [--rate R] [--duration S]" ;;
    esac
done

build rebound amqp_load
start_broker
start_haproxy "$BROKER_PORT"
start_rebound "$BROKER_PORT"
LOAD=$BUILD/bench/amqp_load
RESULTS=$WORK/results.txt
: >"$RESULTS"

port_of() {
    case $1 in D) echo "$BROKER_PORT" ;; H) echo "$HAPROXY_PORT" ;; R) echo "$REBOUND_PORT" ;; esac
}

# run MODE TARGET ROUND ARGS...: one amqp_load run, with the proxies' CPU.
run() {
    local mode=$1 target=$2 round=$3 line rc=0
    shift 3
    local r0 h0 r1 h1
    r0=$(cpu_ticks "$REBOUND_PID")
    h0=$(cpu_ticks "$HAPROXY_PID")
    line=$("$LOAD" "$mode" --port "$(port_of "$target")" --label "$target" \
        --timeout 90 "$@" | grep '^RESULT') || rc=$?
    r1=$(cpu_ticks "$REBOUND_PID")
    h1=$(cpu_ticks "$HAPROXY_PID")
    line="$line round=$round rebound_cpu_s=$(awk -v a="$r0" -v b="$r1" -v t="$CLK_TCK" 'BEGIN{printf "%.2f",(b-a)/t}') haproxy_cpu_s=$(awk -v a="$h0" -v b="$h1" -v t="$CLK_TCK" 'BEGIN{printf "%.2f",(b-a)/t}')"
    echo "$line" | tee -a "$RESULTS"
    [ $rc = 0 ] || log "run $mode $target round $round did not complete (rc $rc)"
}

order() { # rotate D H R by round
    local t=(D H R) k=$(( ($1 - 1) % 3 ))
    echo "${t[@]:k} ${t[@]:0:k}"
}

describe_machine
echo "# loadavg before: $(cut -d' ' -f1-3 /proc/loadavg)"
# warm-up, not counted: a fresh broker is slower for its first minute
for t in D H R; do
    "$LOAD" throughput --port "$(port_of $t)" --count 100000 --timeout 60 >/dev/null || true
done
for ((round = 1; round <= ROUNDS; round++)); do
    wait_quiet 60
    for t in $(order "$round"); do
        run throughput "$t" "$round" --count "$COUNT"
    done
done
for ((round = 1; round <= LAT_ROUNDS; round++)); do
    wait_quiet 60
    for t in $(order "$round"); do
        run latency "$t" "$round" --rate "$RATE" --duration "$DURATION" --warmup 1
    done
done
echo "# loadavg after: $(cut -d' ' -f1-3 /proc/loadavg)"

"$PY" - "$RESULTS" <<'EOF'
import statistics as st, sys
runs = []
for line in open(sys.argv[1]):
    kv = dict(f.split("=", 1) for f in line.split()[1:] if "=" in f)
    runs.append(kv)
def sel(mode, t):
    return [r for r in runs if r.get("mode") == mode and r.get("label") == t
            and r.get("status") == "ok"]
def med(xs):
    return st.median(xs) if xs else float("nan")
names = {"D": "direct", "H": "HAProxy", "R": "rebound"}
print()
print("target  | throughput msg/s (runs, in round order) | median | x direct "
      "| x direct per round (median) | p50 us (runs) | p99 us (runs) | +p50 us | +p99 us")
tp_d = med([float(r["msg_per_s"]) for r in sel("throughput", "D")])
p50_d = med([float(r["p50_us"]) for r in sel("latency", "D")])
p99_d = med([float(r["p99_us"]) for r in sel("latency", "D")])
for t in "DHR":
    tp = [float(r["msg_per_s"]) for r in sel("throughput", t)]
    p50 = [float(r["p50_us"]) for r in sel("latency", t)]
    p99 = [float(r["p99_us"]) for r in sel("latency", t)]
    d_by_round = {r["round"]: float(r["msg_per_s"]) for r in sel("throughput", "D")}
    ratios = [float(r["msg_per_s"]) / d_by_round[r["round"]]
              for r in sel("throughput", t) if r["round"] in d_by_round]
    print(f"{names[t]:7} | {' / '.join(f'{x:.0f}' for x in tp)} | {med(tp):6.0f} | "
          f"{med(tp) / tp_d:8.3f} | {' / '.join(f'{x:.2f}' for x in ratios)} ({med(ratios):.3f}) | "
          f"{' / '.join(f'{x:.0f}' for x in p50)} | "
          f"{' / '.join(f'{x:.0f}' for x in p99)} | "
          f"{med(p50) - p50_d:7.0f} | {med(p99) - p99_d:7.0f}")
print()
print("CPU seconds per 1M messages (published + delivered once each), "
      "summed over the runs through that proxy:")
for mode in ("throughput", "latency"):
    for t, key in (("H", "haproxy_cpu_s"), ("R", "rebound_cpu_s")):
        rs = [r for r in runs if r.get("mode") == mode and r.get("label") == t]
        msgs = sum(int(r.get("msgs", 0)) for r in rs)
        cpu = sum(float(r[key]) for r in rs)
        if msgs:
            print(f"  {mode:10} {names[t]:7}: {cpu:6.2f} s / {msgs} msgs = "
                  f"{cpu / msgs * 1e6:6.2f} s per 1M")
incomplete = [r for r in runs if r.get("status") != "ok"]
if incomplete:
    print(f"\n{len(incomplete)} run(s) did not complete and are left out of the medians")
EOF
