#!/usr/bin/env bash
# tls_bench.sh - rebound with TLS on both sides against HAProxy 2.6 doing the
# same TLS termination and origination, in one run, the targets alternating.
#
#   bench/tls_bench.sh [--rounds N] [--seconds T] [--sizes "B ..."]
#                      [--broker-rounds N] [--broker-count "N ..."]
#                      [--hs-rounds N] [--hs-seconds T] [--parallel P]
#                      [--idle-count N] [--no-broker] [--no-callgrind]
#                      [--quiet-wait S] [--phases "P ..."] [--profile]
#
# Layout: load generator --TLS--> proxy --TLS--> upstream. The load
# generators (bench/pump_client, amqp_load, tls_handshakes, idle_conns)
# speak TLS themselves (OpenSSL), and so do the upstreams (bench/fake_broker
# with --tls-cert, RabbitMQ's TLS listener), so every byte the proxy
# forwards is decrypted and encrypted again by the proxy itself, and no
# other process does TLS on its behalf. Both proxies present the same
# certificate (tests/tls/make_certs.sh: RSA 2048, for localhost and
# 127.0.0.1) and verify the upstream's against the CA and the name
# localhost (sent as SNI):
#   rebound: --listen off --tls-listen 127.0.0.1:P --tls-cert --tls-key
#            --upstream amqps://localhost:PORT --upstream-ca CA --admin off
#            --log-level warn (+ REBOUND_ARGS), default retry policy;
#   HAProxy: nbthread 1, mode tcp, no logging, `bind 127.0.0.1:P ssl crt
#            PEM`, `server upstream 127.0.0.1:PORT ssl verify required
#            ca-file CA sni str(localhost) verifyhost localhost`.
# The tools print what was negotiated (tls=...): TLS 1.3 with
# TLS_AES_256_GCM_SHA384 on both sides of both proxies. The upstreams
# issue no session tickets (RabbitMQ 3.10 on Erlang/OTP 25 does not; the
# fake broker is set up alike), so every upstream handshake is a full one
# for both proxies.
#
# What is measured, each proxy's utime+stime from /proc/PID/stat:
#  1. pump (broker-free): fake_broker floods basic.deliver + header + one
#     body of B bytes (--sizes, default 256 and 16384) to pump_client
#     (no-ack) for T s (--seconds, default 5) after 1 s of warm-up; the
#     proxy alone on core 0, fake_broker and pump_client on core 1 (as in
#     pump_bench.sh). --rounds rounds (default 3), H and R alternating, the
#     order swapped every round. CPU per message and msg/s, and the share
#     of it spent in user space (utime over utime+stime, over the whole
#     pump_client run). --profile: then one more run per proxy under `perf
#     record -e cpu-clock` and where its time went, by shared object and
#     by symbol.
#  2. broker (unless --no-broker): a private RabbitMQ (scripts/broker.sh,
#     its TLS listener); amqp_load throughput --tls: a publisher with
#     confirms (256 outstanding) and a consumer with manual acks (prefetch
#     500), --broker-count messages per size (default 30000 of 256 B, 6000
#     of 16 KiB), --broker-rounds rounds (default 3), alternating; not
#     pinned. CPU per message (published, confirmed, delivered and acked
#     once; the two connections' set-up is in it too).
#  3. handshakes: tls_handshakes keeps --parallel (default 8) new
#     connections in flight to the proxy for --hs-seconds (default 5) after
#     1 s of warm-up: TCP, a full TLS handshake, the AMQP header, the whole
#     connection.start back (so the proxy also connected to fake_broker and
#     did its own full handshake there), close_notify, close. Pinned as in
#     1; --hs-rounds (default 3). Set-ups per second, the proxy's CPU per
#     set-up and share of core 0, the client's and fake_broker's CPU (on
#     core 1: when core 1 is full, the client side is the limit).
#  4. idle: idle_conns --tls opens --idle-count (default 1000) connections
#     through a fresh proxy to the broker (TLS; to fake_broker with
#     --no-broker), TLS and AMQP handshake, channel 1 open, heartbeat 0;
#     VmRSS before, at half, at all, and after closing them.
#  5. callgrind (unless --no-callgrind): bench/callgrind_pump.sh --tls for
#     rebound and for HAProxy (--haproxy): user-space instructions per
#     forwarded frame with TLS on both sides, N 3000 / 15000 messages up to
#     4 KiB, 300 / 900 above, 2 runs each; rebound's figure with its
#     readiness probes taken out, HAProxy's without its start-up.
# The machine is shared: before each round the script waits (at most
# --quiet-wait s, default 20) for less than 15% CPU busy. Prints every
# run (RESULT lines) and a summary with the ratios rebound / HAProxy, per
# round and their median. --phases runs only some of them (default
# "pump broker handshakes idle callgrind"; --no-broker leaves out the
# broker phase and makes idle use fake_broker, --no-callgrind leaves out
# callgrind). Everything it starts is stopped on exit. A default run takes
# about 8 minutes on a quiet machine (plus up to 20 s per round while it is
# busy); --profile adds about 30 s.
set -euo pipefail
. "$(dirname "$0")/bench_lib.sh"

ROUNDS=3 SECS=5 SIZES="256 16384" BROKER_ROUNDS=3 BROKER_COUNT="30000 6000"
HS_ROUNDS=3 HS_SECS=5 PARALLEL=8 IDLE_COUNT=1000 BROKER=1 CALLGRIND=1 PROFILE=0
QUIET_WAIT=20 PHASES="pump broker handshakes idle callgrind"
usage="usage: $0 [--rounds N] [--seconds T] [--sizes \"B ...\"] [--broker-rounds N] [--broker-count \"N ...\"] [--hs-rounds N] [--hs-seconds T] [--parallel P] [--idle-count N] [--no-broker] [--no-callgrind] [--quiet-wait S] [--phases \"P ...\"] [--profile]"
while [ $# -gt 0 ]; do
    case $1 in
        --no-broker) BROKER=0; shift; continue ;;
        --no-callgrind) CALLGRIND=0; shift; continue ;;
        --profile) PROFILE=1; shift; continue ;;
    esac
    [ $# -ge 2 ] || die "$usage"
    case $1 in
        --rounds) ROUNDS=$2 ;;
        --seconds) SECS=$2 ;;
        --sizes) SIZES=$2 ;;
        --broker-rounds) BROKER_ROUNDS=$2 ;;
        --broker-count) BROKER_COUNT=$2 ;;
        --hs-rounds) HS_ROUNDS=$2 ;;
        --hs-seconds) HS_SECS=$2 ;;
        --parallel) PARALLEL=$2 ;;
        --idle-count) IDLE_COUNT=$2 ;;
        --quiet-wait) QUIET_WAIT=$2 ;;
        --phases) PHASES=$2 ;;
        *) die "$usage" ;;
    esac
    shift 2
done
for p in $PHASES; do
    case $p in pump | broker | handshakes | idle | callgrind) ;; *) die "unknown phase $p" ;; esac
done
want() { # PHASE: it is to run
    [[ " $PHASES " == *" $1 "* ]] || return 1
    case $1 in broker) [ "$BROKER" = 1 ] ;; callgrind) [ "$CALLGRIND" = 1 ] ;; esac
}
read -r -a SIZE_LIST <<<"$SIZES"
read -r -a COUNT_LIST <<<"$BROKER_COUNT"
[ "${#COUNT_LIST[@]}" -ge "${#SIZE_LIST[@]}" ] || die "--broker-count: one count per size"
[ "$(nproc)" -ge 2 ] || die "needs 2 cores (pinning: proxy on 0, load on 1)"
command -v haproxy >/dev/null || die "haproxy not installed"
need=$((2 * IDLE_COUNT + 200))
if [ "$(ulimit -n)" -lt "$need" ]; then
    ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
    [ "$(ulimit -n)" -ge "$need" ] || die "ulimit -n is $(ulimit -n), need $need"
fi

build rebound fake_broker pump_client tls_handshakes idle_conns amqp_load
[ -x "$REBOUND" ] || die "no rebound binary at $REBOUND"
[ -x "$BUILD/bench/amqp_load" ] || [ "$BROKER" = 0 ] || die "amqp_load not built (librabbitmq-dev missing?)"
CERTS=$WORK/certs
sh "$ROOT/tests/tls/make_certs.sh" "$CERTS" || die "cannot make certificates"
cat "$CERTS/server.pem" "$CERTS/server.key" >"$CERTS/haproxy.pem"
CA=$CERTS/ca.pem
RESULTS=$WORK/results.txt
: >"$RESULTS"
T0=$SECONDS

# listening PORT: something listens on 127.0.0.1:PORT (asked of the kernel:
# a probe connection would be a failed TLS handshake for the proxy).
listening() {
    [ -n "$(ss -Hltn "sport = :$1" 2>/dev/null)" ]
}

wait_listening() { # PORT PID NAME
    local i
    for ((i = 0; i < 100; i++)); do
        listening "$1" && return 0
        kill -0 "$2" 2>/dev/null || die "$3 exited before listening on $1"
        sleep 0.1
    done
    die "$3 does not listen on 127.0.0.1:$1 after 10 s"
}

# stop_proc PID: TERM, at most 5 s, then KILL; no longer cleaned up on exit.
stop_proc() {
    local pid=$1 i keep=() p
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < 50; i++)); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    for p in "${PIDS[@]}"; do
        [ "$p" = "$pid" ] || keep+=("$p")
    done
    PIDS=("${keep[@]}")
}

# pin CPUS|"": sets PIN, the prefix that pins a command to CPUS (none for
# ""); "${PIN[@]}" COMMAND & keeps $! the command's own pid.
pin() {
    PIN=()
    [ -z "$1" ] || PIN=(taskset -c "$1")
}

# start_fake BODY CPUS: fake_broker over TLS; sets FAKE_PORT, FAKE_PID.
start_fake() {
    local i out=$WORK/fake.$RANDOM.out
    pin "$2"
    "${PIN[@]}" "$BUILD/bench/fake_broker" --listen 127.0.0.1:0 --body-size "$1" \
        --timeout 1800 --tls-cert "$CERTS/server.pem" --tls-key "$CERTS/server.key" \
        >"$out" 2>>"$WORK/fake.log" &
    FAKE_PID=$!
    PIDS+=("$FAKE_PID")
    FAKE_PORT=
    for ((i = 0; i < 100; i++)); do
        FAKE_PORT=$(sed -n 's/^LISTENING //p' "$out" 2>/dev/null || true)
        [ -n "$FAKE_PORT" ] && break
        kill -0 "$FAKE_PID" 2>/dev/null || die "fake_broker exited: $(cat "$WORK/fake.log")"
        sleep 0.1
    done
    [ -n "$FAKE_PORT" ] || die "fake_broker did not say where it listens"
}

# start_haproxy_tls UPSTREAM_PORT UPSTREAM_CA CPUS: sets HAPROXY_PORT/_PID.
start_haproxy_tls() {
    HAPROXY_PORT=$(free_port)
    haproxy_cfg "127.0.0.1:$HAPROXY_PORT ssl crt $CERTS/haproxy.pem" \
        "127.0.0.1:$1 ssl verify required ca-file $2 sni str(localhost) verifyhost localhost" \
        >"$WORK/haproxy.$HAPROXY_PORT.cfg"
    pin "$3"
    "${PIN[@]}" haproxy -db -f "$WORK/haproxy.$HAPROXY_PORT.cfg" >>"$WORK/haproxy.log" 2>&1 &
    HAPROXY_PID=$!
    PIDS+=("$HAPROXY_PID")
    wait_listening "$HAPROXY_PORT" "$HAPROXY_PID" haproxy
}

# start_rebound_tls UPSTREAM_PORT UPSTREAM_CA CPUS: sets REBOUND_PORT/_PID.
start_rebound_tls() {
    REBOUND_PORT=$(free_port)
    pin "$3"
    # shellcheck disable=SC2086 # REBOUND_ARGS is split on spaces on purpose
    "${PIN[@]}" "$REBOUND" --listen off --tls-listen "127.0.0.1:$REBOUND_PORT" \
        --tls-cert "$CERTS/server.pem" --tls-key "$CERTS/server.key" \
        --upstream "amqps://localhost:$1" --upstream-ca "$2" \
        --admin off --log-level warn ${REBOUND_ARGS:-} >>"$WORK/rebound.log" 2>&1 &
    REBOUND_PID=$!
    PIDS+=("$REBOUND_PID")
    wait_listening "$REBOUND_PORT" "$REBOUND_PID" rebound
}

start_proxies() { # UPSTREAM_PORT UPSTREAM_CA CPUS
    start_haproxy_tls "$@"
    start_rebound_tls "$@"
    log "haproxy pid $HAPROXY_PID on $HAPROXY_PORT, rebound pid $REBOUND_PID on $REBOUND_PORT -> TLS 127.0.0.1:$1${3:+, pinned to core $3}"
}

stop_proxies() {
    stop_proc "$HAPROXY_PID"
    stop_proc "$REBOUND_PID"
}

port_of() { case $1 in H) echo "$HAPROXY_PORT" ;; R) echo "$REBOUND_PORT" ;; esac; }
pid_of() { case $1 in H) echo "$HAPROXY_PID" ;; R) echo "$REBOUND_PID" ;; esac; }
order() { if (($1 % 2)); then echo H R; else echo R H; fi; }
ticks_s() { awk -v a="$1" -v b="$2" -v t="$CLK_TCK" 'BEGIN{printf "%.2f", (b - a) / t}'; }
# user_sys PID: "utime stime" in clock ticks (/proc/PID/stat fields 14, 15)
user_sys() {
    local stat
    stat=$(cat "/proc/$1/stat") || die "process $1 is gone"
    stat=${stat##*) }
    # shellcheck disable=SC2086 # split into fields on purpose
    set -- $stat
    echo "${12} ${13}"
}

# pump_run TARGET SIZE ROUND: one pump_client run through the proxy.
pump_run() {
    local pid line u0 s0 u1 s1
    pid=$(pid_of "$1")
    read -r u0 s0 < <(user_sys "$pid")
    line=$(taskset -c 1 "$BUILD/bench/pump_client" --port "$(port_of "$1")" \
        --tls "$CA" --label "$1" --seconds "$SECS" --warmup 1 \
        --cpu-pid "$pid" | grep '^RESULT') || true
    read -r u1 s1 < <(user_sys "$pid")
    echo "${line:-RESULT mode=pump label=$1 status=error} phase=pump size=$2 round=$3 user_ticks=$((u1 - u0)) sys_ticks=$((s1 - s0))"
}

# profile TARGET SIZE: one more pump run under perf; where the proxy's time
# went, by shared object and by symbol.
profile() {
    local pid out=$WORK/perf.$1.$2.data perf_pid
    pid=$(pid_of "$1")
    perf record -e cpu-clock -p "$pid" -o "$out" -- sleep "$SECS" >/dev/null 2>&1 &
    perf_pid=$!
    pump_run "$1" "$2" profile >/dev/null
    wait "$perf_pid" || true
    echo "# perf, $1 ($(case $1 in H) echo HAProxy ;; R) echo rebound ;; esac)), body $2 B: by shared object"
    # awk reads all of it: no SIGPIPE for perf under pipefail
    perf report -i "$out" --stdio --sort dso 2>/dev/null | awk '!/^#/ && NF && n++ < 8'
    echo "# top symbols (OpenSSL's libraries have no symbols here: addresses)"
    perf report -i "$out" --stdio --sort dso,sym 2>/dev/null | awk '!/^#/ && NF && n++ < 15'
}

describe_machine
echo "# $(openssl version); certificates: RSA 2048 (tests/tls/make_certs.sh)"
echo "# loadavg before: $(cut -d' ' -f1-3 /proc/loadavg)"

# ---- 1. pump ---------------------------------------------------------------
want pump && for size in "${SIZE_LIST[@]}"; do
    log "pump, body $size B: $ROUNDS rounds of $SECS s"
    start_fake "$size" 1
    start_proxies "$FAKE_PORT" "$CA" 0
    for ((round = 1; round <= ROUNDS; round++)); do
        wait_quiet "$QUIET_WAIT"
        for t in $(order "$round"); do
            pump_run "$t" "$size" "$round" | tee -a "$RESULTS"
            sleep 0.5 # the proxy drops the flood it still holds
        done
    done
    if [ "$PROFILE" = 1 ]; then
        if perf record -e cpu-clock -o "$WORK/perf.probe" -- true >/dev/null 2>&1; then
            for t in H R; do
                wait_quiet "$QUIET_WAIT"
                profile "$t" "$size"
                sleep 0.5
            done
        else
            log "perf record does not work here: no profile"
        fi
    fi
    stop_proxies
    stop_proc "$FAKE_PID"
done

# ---- 2. broker ---------------------------------------------------------------
# broker_up: the private broker runs; sets BROKER_TLS_PORT and BROKER_CA.
broker_up() {
    [ -n "$BROKER_DIR" ] && return 0
    start_broker
    BROKER_TLS_PORT=$(set +u; . "$BROKER_DIR/env"; echo "$REBOUND_TEST_BROKER_TLS_PORT")
    BROKER_CA=$BROKER_DIR/tls/ca.pem
    if [ -z "$BROKER_TLS_PORT" ] || [ ! -s "$BROKER_CA" ]; then
        die "the broker has no TLS listener"
    fi
}
if want broker; then
    broker_up
    start_proxies "$BROKER_TLS_PORT" "$BROKER_CA" ""
    load() { # TARGET SIZE COUNT LABEL
        "$BUILD/bench/amqp_load" throughput --host localhost --port "$(port_of "$1")" \
            --tls "$CA" --size "$2" --count "$3" --label "$4" --timeout 120
    }
    log "broker warm-up (not counted)"
    for t in H R; do
        load "$t" 256 20000 warmup >/dev/null || true
    done
    for i in "${!SIZE_LIST[@]}"; do
        size=${SIZE_LIST[$i]} count=${COUNT_LIST[$i]}
        log "broker, $count messages of $size B: $BROKER_ROUNDS rounds"
        for ((round = 1; round <= BROKER_ROUNDS; round++)); do
            wait_quiet "$QUIET_WAIT"
            for t in $(order "$round"); do
                pid=$(pid_of "$t")
                c0=$(cpu_ticks "$pid")
                line=$(load "$t" "$size" "$count" "$t" | grep '^RESULT') || true
                c1=$(cpu_ticks "$pid")
                echo "${line:-RESULT mode=throughput label=$t status=error} phase=broker round=$round proxy_cpu_s=$(ticks_s "$c0" "$c1")" | tee -a "$RESULTS"
            done
        done
    done
    stop_proxies
fi

# ---- 3. handshakes ---------------------------------------------------------------
if want handshakes; then
    log "handshakes: $HS_ROUNDS rounds of $HS_SECS s, $PARALLEL in flight"
    start_fake 256 1
    start_proxies "$FAKE_PORT" "$CA" 0
    for ((round = 1; round <= HS_ROUNDS; round++)); do
        wait_quiet "$QUIET_WAIT"
        for t in $(order "$round"); do
            line=$(taskset -c 1 "$BUILD/bench/tls_handshakes" --port "$(port_of "$t")" \
                --tls "$CA" --parallel "$PARALLEL" --seconds "$HS_SECS" --warmup 1 \
                --label "$t" --cpu-pid "$(pid_of "$t")" --other-pid "$FAKE_PID" |
                grep '^RESULT') || true
            echo "${line:-RESULT mode=amqp label=$t status=error} phase=handshake round=$round" | tee -a "$RESULTS"
            sleep 1 # the proxy closes what the last connections left
        done
    done
    stop_proxies
    stop_proc "$FAKE_PID"
fi

# ---- 4. idle ---------------------------------------------------------------------
if want idle; then
    if [ "$BROKER" = 1 ]; then
        broker_up
        up_port=$BROKER_TLS_PORT up_ca=$BROKER_CA up_name="RabbitMQ (TLS)"
    else
        start_fake 256 ""
        up_port=$FAKE_PORT up_ca=$CA up_name="fake_broker (TLS)"
    fi
    log "idle: $IDLE_COUNT connections through each proxy to $up_name"
    start_proxies "$up_port" "$up_ca" ""
    half=$((IDLE_COUNT / 2))
    for t in R H; do
        pid=$(pid_of "$t")
        sleep 1
        r0=$(rss_kib "$pid")
        coproc IDLE { "$BUILD/bench/idle_conns" --port "$(port_of "$t")" --tls "$CA" \
            --count "$IDLE_COUNT" --checkpoints "$half" --hold 180 --channel 2>>"$WORK/idle.log"; }
        read -r -t 180 line <&"${IDLE[0]}" || die "idle_conns: no answer"
        [[ $line == OPEN* ]] || { cat "$WORK/idle.log" >&2; die "idle_conns: $line"; }
        sleep 1
        rh=$(rss_kib "$pid")
        echo go >&"${IDLE[1]}"
        read -r -t 180 line <&"${IDLE[0]}" || die "idle_conns: no answer"
        [[ $line == OPEN* ]] || { cat "$WORK/idle.log" >&2; die "idle_conns: $line"; }
        secs=${line##*secs=}
        sleep 1
        rn=$(rss_kib "$pid")
        echo go >&"${IDLE[1]}"
        wait "$IDLE_PID" 2>/dev/null || true
        sleep 2
        rc=$(rss_kib "$pid")
        echo "RESULT phase=idle label=$t conns=$IDLE_COUNT open_secs=$secs rss_before_kib=$r0 rss_half_kib=$rh rss_all_kib=$rn rss_after_close_kib=$rc" | tee -a "$RESULTS"
    done
    stop_proxies
    [ "$BROKER" = 1 ] || stop_proc "$FAKE_PID"
fi
echo "# loadavg after the timed phases: $(cut -d' ' -f1-3 /proc/loadavg)"

# ---- 5. callgrind -------------------------------------------------------------------
if want callgrind; then
    if ! command -v valgrind >/dev/null; then
        log "valgrind not installed: no instruction counts"
    else
        for size in "${SIZE_LIST[@]}"; do
            if [ "$size" -le 4096 ]; then n=(--small 3000 --large 15000 --repeat 2)
            else n=(--small 300 --large 900 --repeat 2); fi
            for t in R H; do
                log "callgrind, $t, body $size B (${n[*]})"
                if [ "$t" = R ]; then who=(--binary "$REBOUND"); else who=(--haproxy); fi
                out=$WORK/callgrind.$t.$size.txt
                REBOUND_BENCH_BUILD=$BUILD "$ROOT/bench/callgrind_pump.sh" "${who[@]}" --tls \
                    --body-size "$size" "${n[@]}" --top 12 >"$out" 2>&1 ||
                    { tail -n 20 "$out" >&2; die "callgrind_pump.sh failed"; }
                grep -v '^# building' "$out"
                per=$(sed -n 's/^Ir per forwarded frame without the readiness probes.* = \([0-9.]*\) .*/\1/p' "$out")
                [ -n "$per" ] || per=$(sed -n 's/^Ir per forwarded frame = .* = \([0-9.]*\) .*/\1/p' "$out")
                echo "RESULT phase=callgrind label=$t size=$size ir_per_frame=$per" | tee -a "$RESULTS"
            done
        done
    fi
fi
echo "# total $((SECONDS - T0)) s"

# ---- summary ---------------------------------------------------------------------------
"$PY" - "$RESULTS" <<'EOF'
import statistics as st, sys
runs = [dict(f.split("=", 1) for f in l.split()[1:] if "=" in f) for l in open(sys.argv[1])]
names = {"H": "HAProxy", "R": "rebound"}
def med(v):
    return st.median(v) if v else float("nan")
def join(v, spec):
    return " / ".join(format(x, spec) for x in v)
def sel(phase, **kw):
    return [r for r in runs if r.get("phase") == phase and all(r.get(k) == v for k, v in kw.items())]
def ratio_rounds(rows, key):
    by = {}
    for r in rows:
        by.setdefault(r["round"], {})[r["label"]] = r
    return [by[k]["R"][key] / by[k]["H"][key] for k in sorted(by, key=int)
            if "R" in by[k] and "H" in by[k] and by[k]["H"][key] > 0]

if sel("pump"):
    print("\n== 1. pump: deliveries, pump_client -TLS-> proxy (core 0) -TLS-> fake_broker")
    print("size | proxy | msg/s (rounds) | proxy CPU us per message (rounds) | median | core-0 share | user share | R/H per round (median)")
for size in sorted({r["size"] for r in sel("pump")}, key=int):
    rows = [r for r in sel("pump", size=size) if r.get("status") == "ok"]
    for r in rows:
        r["us_msg"] = float(r["cpu_secs"]) / int(r["msgs"]) * 1e6 if int(r["msgs"]) else float("nan")
    rat = ratio_rounds(rows, "us_msg")
    for t in "HR":
        rs = [r for r in rows if r["label"] == t]
        us = [r["us_msg"] for r in rs]
        rate = [float(r["msgs_per_s"]) for r in rs]
        util = [float(r["core_util"]) for r in rs]
        usr = sum(int(r.get("user_ticks", 0)) for r in rs)
        tot = usr + sum(int(r.get("sys_ticks", 0)) for r in rs)
        print(f"{size} | {names[t]} | {join(rate, ',.0f')} | {join(us, '.3f')} | "
              f"{med(us):.3f} | {med(util):.2f} | {usr / tot if tot else float('nan'):.2f} | "
              + (f"{join(rat, '.2f')} ({med(rat):.2f})" if t == "R" else "-"))
    tls = {r.get("tls") for r in rows}
    print(f"  negotiated (client side): {', '.join(sorted(x for x in tls if x))}")

b = sel("broker")
if b:
    print("\n== 2. broker: amqp_load --tls -> proxy -TLS-> RabbitMQ (publish + confirm + deliver + ack)")
    print("size | proxy | msg/s (rounds) | proxy CPU us per message (rounds) | median | total | R/H per round (median)")
    for size in sorted({r["size"] for r in b if "size" in r}, key=int):
        rows = [r for r in b if r.get("size") == size and r.get("status") == "ok"]
        for r in rows:
            r["us_msg"] = float(r["proxy_cpu_s"]) / int(r["msgs"]) * 1e6
        rat = ratio_rounds(rows, "us_msg")
        for t in "HR":
            rs = [r for r in rows if r["label"] == t]
            us = [r["us_msg"] for r in rs]
            tot = sum(float(r["proxy_cpu_s"]) for r in rs) / max(1, sum(int(r["msgs"]) for r in rs)) * 1e6
            rate = [float(r["msg_per_s"]) for r in rs]
            print(f"{size} | {names[t]} | {join(rate, ',.0f')} | {join(us, '.2f')} | "
                  f"{med(us):.2f} | {tot:.2f} | "
                  + (f"{join(rat, '.2f')} ({med(rat):.2f})" if t == "R" else "-"))
    bad = [r for r in b if r.get("status") != "ok"]
    if bad:
        print(f"  {len(bad)} broker run(s) did not complete and are left out")

h = [r for r in sel("handshake") if r.get("status") == "ok"]
if h:
    print("\n== 3. handshakes: new TLS connection + upstream TLS connection + connection.start, each")
    print("proxy | set-ups/s (rounds) | p50 ms | proxy CPU ms per set-up (rounds) | median | core-0 share | core-1 share (client + fake_broker) | R/H per round (median)")
    for r in h:
        r["ms"] = float(r["cpu_ms_per_setup"])
    rat = ratio_rounds(h, "ms")
    for t in "HR":
        rs = [r for r in h if r["label"] == t]
        ms = [r["ms"] for r in rs]
        core1 = [(float(r["self_cpu_s"]) + float(r["other_cpu_s"])) / float(r["secs"]) for r in rs]
        rate = [float(r["setups_per_s"]) for r in rs]
        p50 = [float(r["p50_ms"]) for r in rs]
        util = [float(r["core_util"]) for r in rs]
        print(f"{names[t]} | {join(rate, '.0f')} | {med(p50):.1f} | {join(ms, '.3f')} | "
              f"{med(ms):.3f} | {med(util):.2f} | {join(core1, '.2f')} | "
              + (f"{join(rat, '.2f')} ({med(rat):.2f})" if t == "R" else "-"))
    errs = sum(int(r["errors"]) for r in h)
    res = sum(int(r["resumed"]) for r in h)
    print(f"  errors {errs}, resumed sessions {res}; negotiated: {', '.join(sorted({r['tls'] for r in h}))}")

i = sel("idle")
if i:
    print("\n== 4. idle TLS connections (TLS + AMQP handshake, channel 1 open)")
    print("proxy | RSS KiB before / half / all / after close | KiB per conn (all-before)/N | marginal (all-half)/(N-half)")
    for r in i:
        n = int(r["conns"]); half = n // 2
        b0, bh, ba, bc = (int(r[k]) for k in ("rss_before_kib", "rss_half_kib", "rss_all_kib", "rss_after_close_kib"))
        print(f"{names[r['label']]} | {b0} / {bh} / {ba} / {bc} | {(ba - b0) / n:.2f} | {(ba - bh) / (n - half):.2f}")
    per = {r["label"]: (int(r["rss_all_kib"]) - int(r["rss_before_kib"])) / int(r["conns"]) for r in i}
    if per.get("H"):
        print(f"  R/H: {per['R'] / per['H']:.2f}")

c = sel("callgrind")
if c:
    print("\n== 5. callgrind: user-space Ir per forwarded frame, TLS on both sides (3 frames a message)")
    print("size | HAProxy | rebound | R/H")
    for size in sorted({r["size"] for r in c}, key=int):
        v = {r["label"]: float(r["ir_per_frame"] or "nan") for r in c if r["size"] == size}
        print(f"{size} | {v.get('H', float('nan')):,.1f} | {v.get('R', float('nan')):,.1f} | "
              f"{v.get('R', float('nan')) / v.get('H', float('nan')):.2f}")
EOF
