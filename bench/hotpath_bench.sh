#!/usr/bin/env bash
# hotpath_bench.sh - the forwarding hot path in one command: user-space
# instructions (Ir, counted by callgrind: deterministic) per forwarded
# frame, rebound next to HAProxy, for the workloads below; or, with
# --syscalls, system calls per 1000 forwarded frames.
#
#   bench/hotpath_bench.sh [--binary PATH] [--only rebound|haproxy]
#                          [--workloads W,W,...] [--quick] [--repeat R]
#                          [--syscalls] [--messages N]
#
# Every workload runs bench/fake_broker <-> proxy <-> bench/pump_client,
# plain TCP on loopback, one connection, no broker (see
# bench/callgrind_pump.sh, which does the measuring):
#
#   workload     what flows                                       N1 / N2
#   noack-256    deliveries, 256 B bodies, no-ack consumer     20000 / 60000
#   noack-16k    the same, 16 KiB bodies                        5000 / 15000
#   publish-256  basic.publish + header + 256 B body,          20000 / 60000
#                client -> broker, no confirms
#   publish-16k  the same, 16 KiB bodies                        5000 / 15000
#   ack-p10      deliveries (256 B) to a consumer that acks    10000 / 30000
#   ack-p100     each one (basic.ack, multiple 0, the acks of  10000 / 30000
#   ack-p1000    a read in one write), prefetch 10, 100, 1000  10000 / 30000
#   retry        deliveries (256 B) to a consumer that nacks     3000 / 9000
#                each one (requeue, prefetch 100); rebound
#                (--retry-tiers 60s --max-attempts 5) publishes
#                a copy to the tier on its own channel, waits
#                for the confirm, acks the original (rebound
#                only: HAProxy has no retry path, shown as —)
#
# Callgrind (default): for each workload and proxy, one run of
# `bench/callgrind_pump.sh --mode M --body-size B [--prefetch P] --small N1
# --large N2 --repeat R` (R: --repeat, default 1): the proxy under valgrind
# --tool=callgrind, Ir(N) its instructions over a whole run of N messages
# (the mean of R runs), and
#
#   Ir per forwarded frame = (Ir(N2) - Ir(N1)) / (F N2 - F N1)
#
# where F is the frames the proxy forwards a message: 3 (method, header,
# body) for noack and publish; 4 for ack (the 3 of the delivery one way and
# the basic.ack the other way); 9 for retry (the delivery, the client's
# nack, the copy's 3, the broker's confirm, the ack of the original; the
# copies go on rebound's separate retry connection, its default). The
# last column is rebound's Ir per message, F times its Ir per frame (retry:
# Ir per retried message = (Ir(N2) - Ir(N1)) / (N2 - N1)). Start-up,
# handshake and shutdown cancel out. Every run is checked (exact frame
# counts at pump_client, exact counts of deliveries written / acked /
# messages published (retry: copies confirmed, no nack or reject passed
# on) at fake_broker, the proxy's exit status); a failed run shows as FAILED and
# the script exits 1 after the table. HAProxy: Debian's haproxy, TCP mode,
# nbthread 1, no logging, start-up not counted (callgrind_pump.sh --haproxy).
# rebound's readiness probe (every 2 s) may add a connection to one run
# and not the other: conns=C1/C2 in the per-run lines says so (the
# connections that reached fake_broker: the session, rebound's retry
# connection in ack and retry workloads, and its probes; HAProxy: 1). Whole runs differ a little even
# so: how the kernel splits the streams into reads varies, and what rebound does
# per delivery (a malloc and a free) costs glibc more or less depending on
# the heap a run ends up with (ack workloads: about +-8% between runs);
# --repeat 3 gives means. The default sizes take about a minute in all.
#
# --syscalls: instead of callgrind, each workload runs once natively with
# --messages N (default 200000; 16 KiB workloads too) and `perf stat -e
# 'syscalls:sys_enter_*' -p PID` attached to the proxy once it listens,
# until it exits (after SIGTERM): every system call of the proxy's process
# (all its threads), counted by tracepoint. Printed: their sum per 1000
# forwarded frames (F N frames, as above), and the most frequent calls.
# What is counted is the whole session, not only its steady state: the
# client's connection and handshake, the upstream connection, rebound's
# readiness probes, the close and the shutdown are included (start-up
# before the proxy listens is not); at N = 200000 they are a small share.
# perf needs root (or a low perf_event_paranoid) and tracefs; closing 360
# tracepoint events takes it about 15 s a run.
#
# --binary PATH: the rebound to measure (e.g. an older commit's Release
# build); default: the tree, built Release in $REBOUND_BENCH_BUILD (default
# build-rel). Either way the binary is copied once, so every run measures
# the same one even if the tree changes meanwhile. --only: one proxy.
# --workloads: a subset, comma-separated names from the table. --quick:
# every N divided by 10 (a smoke test: start-up noise weighs more).
# --messages N: the N of --syscalls. KEEP=1 keeps the scratch directory
# (logs of every run).
#
# Output: a markdown table, one row per workload: F, rebound and HAProxy
# (Ir per frame, or syscalls per 1000 frames), rebound / HAProxy, and
# rebound's Ir (syscalls) per message.
set -euo pipefail
. "$(dirname "$0")/bench_lib.sh"

ALL_WORKLOADS=noack-256,noack-16k,publish-256,publish-16k,ack-p10,ack-p100,ack-p1000,retry
WORKLOADS=$ALL_WORKLOADS TARGETS="rebound haproxy" QUICK=0 SYSCALLS=0
SC_N=200000 REPEAT=1
usage="usage: $0 [--binary PATH] [--only rebound|haproxy] [--workloads W,W,...] [--quick] [--repeat R] [--syscalls] [--messages N]"
while [ $# -gt 0 ]; do
    case $1 in
        --quick) QUICK=1; shift; continue ;;
        --syscalls) SYSCALLS=1; shift; continue ;;
    esac
    [ $# -ge 2 ] || die "$usage"
    case $1 in
        --binary) REBOUND_BIN=$(realpath "$2"); REBOUND=$REBOUND_BIN ;;
        --only)
            case $2 in rebound | haproxy) TARGETS=$2 ;; *) die "$usage" ;; esac ;;
        --workloads) WORKLOADS=$2 ;;
        --messages) SC_N=$2 ;;
        --repeat) REPEAT=$2 ;;
        *) die "$usage" ;;
    esac
    shift 2
done
[[ $SC_N =~ ^[1-9][0-9]*$ ]] && [[ $REPEAT =~ ^[1-9][0-9]*$ ]] || die "$usage"

# workload NAME: sets W_MODE, W_BODY, W_PREFETCH (ack), W_N1, W_N2 (the
# callgrind sizes, --quick applied) and W_FWD (frames forwarded a message).
workload() {
    W_PREFETCH=0
    case $1 in
        noack-256) W_MODE=noack W_BODY=256 W_N1=20000 W_N2=60000 ;;
        noack-16k) W_MODE=noack W_BODY=16384 W_N1=5000 W_N2=15000 ;;
        publish-256) W_MODE=publish W_BODY=256 W_N1=20000 W_N2=60000 ;;
        publish-16k) W_MODE=publish W_BODY=16384 W_N1=5000 W_N2=15000 ;;
        ack-p10 | ack-p100 | ack-p1000)
            W_MODE=ack W_BODY=256 W_PREFETCH=${1#ack-p} W_N1=10000 W_N2=30000 ;;
        retry) W_MODE=retry W_BODY=256 W_PREFETCH=100 W_N1=3000 W_N2=9000 ;;
        *) die "unknown workload $1 (known: $ALL_WORKLOADS)" ;;
    esac
    if [ "$QUICK" = 1 ]; then
        W_N1=$((W_N1 / 10)) W_N2=$((W_N2 / 10))
    fi
    W_FWD=3
    [ "$W_MODE" = ack ] && W_FWD=4
    [ "$W_MODE" = retry ] && W_FWD=9
    return 0
}
IFS=, read -r -a WLS <<<"$WORKLOADS"
for w in "${WLS[@]}"; do workload "$w"; done

if [[ " $TARGETS " == *" rebound "* ]]; then
    build rebound fake_broker pump_client
    [ -x "$REBOUND" ] || die "no rebound binary at $REBOUND"
    describe_rebound --binary
    cp "$REBOUND" "$WORK/rebound"   # the tree may change while this runs
    REBOUND=$WORK/rebound
else
    build fake_broker pump_client
    echo "# $(date -u +%Y-%m-%dT%H:%M:%SZ) $(uname -r), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
fi
if [[ " $TARGETS " == *" haproxy "* ]]; then
    command -v haproxy >/dev/null || die "haproxy not installed"
    echo "# haproxy: $(haproxy -v | head -n 1 | cut -d' ' -f1-3) ($(command -v haproxy)), TCP mode, nbthread 1, no logging"
fi

declare -A VAL DETAIL PER_MSG
FAILED=()

# ---- callgrind --------------------------------------------------------------

# cg_run TARGET WORKLOAD: one callgrind_pump.sh run; VAL[TARGET.WORKLOAD]
# is its Ir per forwarded frame (or FAILED).
cg_run() {
    local target=$1 wl=$2 log=$WORK/cg.$1.$2.log line t0=$SECONDS
    local args=(--mode "$W_MODE" --body-size "$W_BODY" --prefetch "${W_PREFETCH:-100}"
        --small "$W_N1" --large "$W_N2" --repeat "$REPEAT" --top 0)
    if [ "$target" = haproxy ]; then
        args+=(--haproxy)
    else
        args+=(--binary "$REBOUND")
    fi
    log "$target $wl: callgrind_pump.sh ${args[*]}"
    if "$ROOT/bench/callgrind_pump.sh" "${args[@]}" >"$log" 2>&1 &&
        line=$(grep '^RESULT target=' "$log"); then
        VAL[$target.$wl]=$(echo "$line" | sed -n 's/.* ir_per_frame=\([0-9.]*\).*/\1/p')
        PER_MSG[$target.$wl]=$(echo "$line" | sed -n 's/.* ir_per_msg=\([0-9]*\).*/\1/p')
        DETAIL[$target.$wl]="Ir/message $(echo "$line" | sed -n 's/.* ir_per_msg=\([0-9]*\).*/\1/p'), memcpy/memmove per frame $(echo "$line" | sed -n 's/.* memcpy_per_frame=\([0-9.]*\).*/\1/p'), conns $(echo "$line" | sed -n 's/.* conns=\([0-9,\/]*\).*/\1/p'), $((SECONDS - t0)) s"
    else
        VAL[$target.$wl]=FAILED
        FAILED+=("$target $wl: $(grep -m1 '^bench:' "$log" || tail -n 1 "$log")")
    fi
}

# ---- syscalls ----------------------------------------------------------------

# start_proxy TARGET TAG UPSTREAM_PORT: the proxy, natively, on a free
# port; sets PROXY_PID and PROXY_PORT once it listens.
start_proxy() {
    local target=$1 tag=$2 i
    PROXY_PORT=$(free_port)
    if [ "$target" = haproxy ]; then
        haproxy_cfg "127.0.0.1:$PROXY_PORT" "127.0.0.1:$3" >"$WORK/haproxy.$tag.cfg"
        haproxy -db -f "$WORK/haproxy.$tag.cfg" >"$WORK/proxy.$tag.log" 2>&1 &
    else
        local retry=()
        [ "$W_MODE" = retry ] && retry=(--retry-tiers 60s --max-attempts 5)
        "$REBOUND" --listen "127.0.0.1:$PROXY_PORT" --upstream "127.0.0.1:$3" \
            --admin off --log-level warn "${retry[@]}" >"$WORK/proxy.$tag.log" 2>&1 &
    fi
    PROXY_PID=$!
    PIDS+=("$PROXY_PID")
    for ((i = 0; i < 100; i++)); do
        listening "$PROXY_PORT" && return 0
        kill -0 "$PROXY_PID" 2>/dev/null || die "$target exited: $(cat "$WORK/proxy.$tag.log")"
        sleep 0.1
    done
    die "$target does not listen on $PROXY_PORT after 10 s"
}

# attach_perf PID TAG: perf stat on every sys_enter_* tracepoint of PID,
# counting from when this returns (perf starts disabled and acknowledges
# "enable" on its control FIFO); sets PERF_PID. Counts go to
# $WORK/perf.TAG.csv when PID exits.
attach_perf() {
    local ctl=$WORK/perf.$2.ctl ack=$WORK/perf.$2.ack reply="" cfd afd
    mkfifo "$ctl" "$ack"
    exec {cfd}<>"$ctl" {afd}<>"$ack"   # read-write: opening does not block
    perf stat -x, -o "$WORK/perf.$2.csv" -D -1 --control "fifo:$ctl,$ack" \
        -e 'syscalls:sys_enter_*' -p "$1" 2>"$WORK/perf.$2.err" &
    PERF_PID=$!
    PIDS+=("$PERF_PID")
    echo enable >&"$cfd"
    read -r -t 60 -u "$afd" reply || true
    exec {cfd}>&- {afd}>&-
    [ "$reply" = ack ] || die "perf stat did not start counting: $(cat "$WORK/perf.$2.err")"
}

# wait_gone PID WHAT SECS: until PID has exited (dies after SECS seconds).
wait_gone() {
    local i
    for ((i = 0; i < $3 * 10; i++)); do
        kill -0 "$1" 2>/dev/null || return 0
        sleep 0.1
    done
    die "$2 still running after $3 s"
}

# sc_run TARGET WORKLOAD: one native run of SC_N messages with perf
# attached; VAL[TARGET.WORKLOAD] is syscalls per 1000 forwarded frames,
# DETAIL[...] the most frequent calls.
sc_run() {
    local target=$1 wl=$2 tag=$1.$2 n=$SC_N fpm line rc=0 t0=$SECONDS
    fpm=$((W_BODY > 0 ? 3 : 2))
    log "$target $wl: $n messages, perf stat attached"
    start_fake_broker "$tag" --messages "$n" --body-size "$W_BODY"
    start_proxy "$target" "$tag" "$FAKE_PORT"
    attach_perf "$PROXY_PID" "$tag"
    pump_mode_args "$W_MODE" "$W_PREFETCH" "$W_BODY"
    line=$("$BUILD/bench/pump_client" --port "$PROXY_PORT" --messages "$n" \
        --seconds 600 --label "$tag" "${PUMP_MODE_ARGS[@]}" | grep '^RESULT') || true
    echo "$line" >>"$WORK/results.txt"
    check_pump_line "$W_MODE" "$n" "$fpm" "$line"
    kill -TERM "$PROXY_PID"
    wait_gone "$PROXY_PID" "$target" 60
    wait "$PROXY_PID" || rc=$?
    [ "$target" = haproxy ] && [ "$rc" = 143 ] && rc=0
    [ "$rc" = 0 ] || die "$target exited with $rc: $(tail -n 20 "$WORK/proxy.$tag.log")"
    wait_gone "$PERF_PID" "perf stat" 120
    wait "$PERF_PID" || die "perf stat failed: $(cat "$WORK/perf.$tag.err")"
    kill -TERM "$FAKE_PID" 2>/dev/null || true
    wait "$FAKE_PID" || true
    PIDS=()
    check_fake_log "$W_MODE" "$n" "$fpm" "$WORK/fake.$tag.log"
    local res
    res=$("$PY" - "$WORK/perf.$tag.csv" $((n * W_FWD)) <<'EOF'
import sys
counts = {}
for row in open(sys.argv[1]):
    f = row.strip().split(",")
    if len(f) > 2 and f[0].isdigit() and f[2].startswith("syscalls:sys_enter_"):
        counts[f[2][len("syscalls:sys_enter_"):]] = int(f[0])
frames = int(sys.argv[2])
total = sum(counts.values())
if not counts.get("accept4", 0) + counts.get("accept", 0):
    sys.exit("no accept counted: perf was not attached while the client connected")
top = sorted(counts.items(), key=lambda kv: -kv[1])[:6]
print(f"{total / frames * 1000:.2f}")
print(f"{total} calls: " + ", ".join(f"{k} {v / frames * 1000:.2f}" for k, v in top if v))
EOF
    ) || die "perf output $WORK/perf.$tag.csv: $res"
    VAL[$tag]=$(echo "$res" | head -n 1)
    PER_MSG[$tag]=$("$PY" -c 'import sys; print(f"{float(sys.argv[1]) * int(sys.argv[2]) / 1000:.2f}")' "${VAL[$tag]}" "$W_FWD")
    DETAIL[$tag]="$(echo "$res" | tail -n 1); $(echo "$line" | sed -n 's/.* secs=\([0-9.]*\).*/\1/p') s of traffic, $((SECONDS - t0)) s in all"
}

if [ "$SYSCALLS" = 1 ]; then
    command -v perf >/dev/null || die "perf not installed"
    perf list 'syscalls:sys_enter_read' 2>/dev/null | grep -q sys_enter_read ||
        die "no syscalls:sys_enter_* tracepoints (root and tracefs needed)"
    [ "$QUICK" = 1 ] && SC_N=$((SC_N / 10))
    echo "# system calls of the proxy process (perf stat -e 'syscalls:sys_enter_*' -p PID, $(perf --version)),"
    echo "# one native run of N = $SC_N messages per workload; session start-up (connections, handshake,"
    echo "# rebound's readiness probes) and shutdown are included in the count"
else
    command -v valgrind >/dev/null || die "valgrind not installed"
    echo "# $(valgrind --version): Ir per forwarded frame = (Ir(N2) - Ir(N1)) / (F N2 - F N1), bench/callgrind_pump.sh --repeat $REPEAT"
fi
[ "$QUICK" = 1 ] && echo "# --quick: every N divided by 10"
: >"$WORK/results.txt"
T0=$SECONDS
for w in "${WLS[@]}"; do
    workload "$w"
    for t in $TARGETS; do
        if [ "$W_MODE" = retry ] && [ "$t" = haproxy ]; then
            VAL[$t.$w]=— DETAIL[$t.$w]="no retry path"
            continue
        fi
        if [ "$SYSCALLS" = 1 ]; then
            sc_run "$t" "$w"
        else
            cg_run "$t" "$w"
        fi
        echo "# $t $w: ${VAL[$t.$w]} (${DETAIL[$t.$w]:-see below})"
    done
done

echo
if [ "$SYSCALLS" = 1 ]; then
    unit="syscalls / 1000 frames" n_col="N" msg_unit="syscalls / message"
else
    unit="Ir / frame" n_col="N1 / N2" msg_unit="Ir / message"
fi
echo "| workload | F | $n_col | rebound $unit | HAProxy $unit | rebound / HAProxy | rebound $msg_unit |"
echo "| --- | --- | --- | --- | --- | --- | --- |"
for w in "${WLS[@]}"; do
    workload "$w"
    r=${VAL[rebound.$w]:--} h=${VAL[haproxy.$w]:--}
    ratio=$("$PY" -c 'import sys
try: print(f"{float(sys.argv[1]) / float(sys.argv[2]):.1f}x")
except (ValueError, ZeroDivisionError): print("-")' "$r" "$h")
    [ "$h" = — ] && ratio=—
    n=$W_N1/$W_N2
    [ "$SYSCALLS" = 1 ] && n=$SC_N
    echo "| $w | $W_FWD | $n | $r | $h | $ratio | ${PER_MSG[rebound.$w]:--} |"
done
echo
echo "F: frames the proxy forwards a message (noack, publish: method + header + body; ack: those 3 + the basic.ack;"
echo "retry: the delivery's 3, the client's nack, the copy's 3, the broker's confirm, the ack of the original)."
echo "rebound $msg_unit: F times the per-frame figure (retry: per retried message)."
echo "# $((SECONDS - T0)) s"
if [ "${#FAILED[@]}" -gt 0 ]; then
    printf 'FAILED: %s\n' "${FAILED[@]}"
    exit 1
fi
