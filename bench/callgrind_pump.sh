#!/usr/bin/env bash
# callgrind_pump.sh - user-space instructions rebound executes per forwarded
# frame, without a broker, counted by callgrind (deterministic, unlike time).
#
#   bench/callgrind_pump.sh [--binary PATH] [--body-size B] [--small N1]
#                           [--large N2] [--repeat R] [--top K] [--tls]
#                           [--haproxy] [--mode noack|ack|publish|retry]
#                           [--prefetch P] [--retry-connection separate|shared]
#
# One run of N messages: bench/fake_broker --messages N --body-size B writes
# exactly N deliveries (basic.deliver + content header + one body frame of
# B bytes: 3 frames a message; 2 when B is 0) to the consumer; rebound runs
# under `valgrind --tool=callgrind` between it and bench/pump_client
# --messages N (no-ack), which counts every frame, closes its connection
# (connection.close / close-ok) after the N-th message and exits; then
# rebound gets SIGTERM, exits, and callgrind writes its totals. Ir(N) is
# the instruction count of the whole process life: start-up, handshake,
# N messages, shutdown. What does not depend on N cancels in
#
#   Ir per forwarded frame = (Ir(N2) - Ir(N1)) / (frames(N2) - frames(N1))
#
# frames counted by pump_client (checked to be 3 N, 2 N for B = 0). Each
# size runs R times (default 2) to show how repeatable the totals are (they
# differ a little: how the kernel splits the byte stream into reads, and
# rebound's 2 s upstream probe timer, vary with timing); Ir(N) is their
# mean. The same
# difference without libc's memcpy/memmove is printed too: a copy of more
# than about 8 KiB goes through `rep movsb`, which callgrind counts as one
# instruction per byte, so big copies weigh far more in Ir than in time.
# Then the top K (default 10) functions by self Ir of the first large run
# (callgrind_annotate), and the top K by self Ir per forwarded frame (first
# large run minus first small run, per frame: start-up cancels out).
#
# --mode (default noack, all of the above) picks the workload:
#   noack    as above: deliveries broker -> client, no acknowledgements.
#   ack      pump_client --ack --prefetch P (default 100): basic.qos
#            prefetch-count P, basic.consume without no-ack, and a basic.ack
#            (multiple 0) for every delivery once it is complete, the acks
#            of one read written together; fake_broker keeps at most P
#            deliveries unacknowledged and writes more as acks free room.
#            The proxy forwards the deliveries (3 frames a message, counted
#            by pump_client, 3 N) and the acks (1 a message, the other way),
#            so here
#              Ir per delivered message = (Ir(N2) - Ir(N1)) / (N2 - N1)
#              Ir per forwarded frame   = (Ir(N2) - Ir(N1)) / (4 N2 - 4 N1)
#            (checked: pump_client wrote N acks, fake_broker got N
#            deliveries acknowledged and no ack of an unknown tag).
#   publish  pump_client --publish --body-size B: N messages (basic.publish
#            to exchange "" + content header + one body frame; 3 frames, 2
#            for B = 0) client -> broker as fast as the socket takes them,
#            no confirms, then connection.close / close-ok. The frames
#            counted are the ones pump_client wrote (checked to be 3 N), and
#            fake_broker must have received exactly N complete messages.
#   retry    the retry path (rebound only): pump_client --nack --prefetch P
#            (default 100): consumes as in ack but answers every delivery
#            with basic.nack (multiple 0, requeue 1), the nacks of one read
#            written together. rebound runs with its default policy (every
#            queue retried) and --retry-tiers 60s --max-attempts 5, so each
#            nack becomes a copy to the tier queue pump.retry.1m and nothing
#            is dead-lettered or comes back within the run: rebound opens
#            its own channel (channel.open, confirm.select), declares the
#            tier queue once, publishes the copy (basic.publish + content
#            header with its headers added + body), and once fake_broker
#            confirms it (basic.ack, one per copy) acks the original on the
#            consumer's channel; only that ack frees prefetch room at
#            fake_broker. By default (rebound's default, --retry-connection
#            separate) the copies go on a second upstream connection rebound
#            opens per client; --retry-connection shared puts rebound's
#            channel on the client's own upstream connection. Per message
#            rebound handles 3 + 1 + 3 + 1 + 1 = 9 frames (2 + 1 + 2 + 1 + 1
#            = 7 for B = 0): the delivery, the nack, the copy, the confirm,
#            the ack of the original, so
#              Ir per retried message = (Ir(N2) - Ir(N1)) / (N2 - N1)
#              Ir per frame           = that / 9
#            (checked: pump_client read 3 N frames and wrote N nacks;
#            fake_broker wrote N deliveries, received N complete copies on a
#            confirm channel and confirmed each, got N deliveries
#            acknowledged, no ack of an unknown tag, no nack, no reject).
# Every run also ends with a line "RESULT target=... mode=... ir_per_frame=
# ... ir_per_msg=... conns=C1/C2" for scripts (bench/hotpath_bench.sh);
# C1, C2: the connections that reached fake_broker in the runs of N1 and N2
# (the session; rebound's separate retry connection, which it opens once a
# consumer of a queue its policy covers appears, i.e. in ack and retry
# mode, unless --retry-connection shared; and rebound's readiness probes:
# a probe more in one run adds its Ir).
#
# --binary: the rebound to measure (default: build the tree, Release, in
# $REBOUND_BENCH_BUILD, default build-rel). fake_broker and pump_client are
# always built from the tree. Defaults: B 256, N1 20000, N2 60000. KEEP=1
# keeps the scratch directory with the callgrind.out files.
#
# --tls: TLS on both sides (certificates from tests/tls/make_certs.sh):
# pump_client speaks TLS to the proxy, which terminates it and originates
# its own TLS to fake_broker (no session tickets: a full handshake), so the
# Ir include OpenSSL's work on both sides (decrypting and encrypting every
# byte once each). rebound: --tls-listen, --upstream amqps://localhost:PORT
# --upstream-ca; its readiness probe dials the upstream every 2 s (a TLS
# handshake each), so the connections that reached fake_broker's protocol
# header are printed per run (the session, its retry connection in ack
# and retry mode, and the probes; a probe cut short by the shutdown is not
# counted): a run with more probes has more Ir. The script then
# measures what one probe costs (two runs of rebound with no client, 3 s
# and 13 s: the difference in Ir over the difference in probes) and also
# prints Ir per frame with the probes taken out. Without --tls it does the
# same when the runs of N1 and N2 saw different numbers of connections (a
# run that lasts longer under callgrind, e.g. --mode retry, may see one
# probe more). With --tls libc's memset
# per frame is printed too (OpenSSL's BUF_MEM_grow_clean zeroes what a
# memory BIO grows by: one Ir per byte under callgrind, like big copies).
# --haproxy: measure Debian's HAProxy (TCP mode, nbthread 1, no logging;
# with --tls: `bind ... ssl crt`, `server ... ssl verify required ca-file
# ... sni str(localhost) verifyhost localhost`) under callgrind in the same
# way instead of rebound; it has no probe. HAProxy's exit on SIGTERM
# (status 143) counts as a clean exit. Its start-up is not counted
# (valgrind --instr-atstart=no, then `callgrind_control -i on` once it
# listens): loading its configuration runs a few big-number
# exponentiations whose cost varies from run to run by several million Ir,
# which would otherwise swamp the difference between two runs.
set -euo pipefail
. "$(dirname "$0")/bench_lib.sh"

BODY=256 N1=20000 N2=60000 REPEAT=2 TOP=10 TLS=0 TARGET=rebound MODE=noack
PREFETCH=100 RETRY_CONN=
usage="usage: $0 [--binary PATH] [--body-size B] [--small N1] [--large N2] [--repeat R] [--top K] [--tls] [--haproxy] [--mode noack|ack|publish|retry] [--prefetch P] [--retry-connection separate|shared]"
while [ $# -gt 0 ]; do
    case $1 in
        --tls) TLS=1; shift; continue ;;
        --haproxy) TARGET=haproxy; shift; continue ;;
    esac
    [ $# -ge 2 ] || die "$usage"
    case $1 in
        --binary) REBOUND_BIN=$(realpath "$2"); REBOUND=$REBOUND_BIN ;;
        --body-size) BODY=$2 ;;
        --small) N1=$2 ;;
        --large) N2=$2 ;;
        --repeat) REPEAT=$2 ;;
        --top) TOP=$2 ;;
        --mode) MODE=$2 ;;
        --prefetch) PREFETCH=$2 ;;
        --retry-connection)
            case $2 in separate | shared) RETRY_CONN=$2 ;; *) die "$usage" ;; esac ;;
        *) die "$usage" ;;
    esac
    shift 2
done
for v in "$BODY" "$N1" "$N2" "$REPEAT" "$TOP" "$PREFETCH"; do
    [[ $v =~ ^[0-9]+$ ]] || die "$usage"
done
case $MODE in noack | ack | publish | retry) ;; *) die "$usage" ;; esac
[ "$MODE" = retry ] && [ "$TARGET" = haproxy ] && die "--mode retry: HAProxy has no retry path"
[ -n "$RETRY_CONN" ] && [ "$MODE" != retry ] && die "--retry-connection goes with --mode retry"
# rebound's flags for the retry workload: one 60 s tier, nothing dead-lettered
RETRY_FLAGS=()
if [ "$MODE" = retry ]; then
    RETRY_FLAGS=(--retry-tiers 60s --max-attempts 5)
    [ -n "$RETRY_CONN" ] && RETRY_FLAGS+=(--retry-connection "$RETRY_CONN")
fi
[ "$PREFETCH" -le 65535 ] || die "--prefetch P: at most 65535 (basic.qos)"

[ "$N1" -ge 1 ] && [ "$N2" -gt "$N1" ] || die "need 1 <= N1 < N2"
[ "$REPEAT" -ge 1 ] || die "--repeat R: R >= 1"
[ "$BODY" -le 131000 ] || die "--body-size B: at most 131000 (one body frame)"
command -v valgrind >/dev/null || die "valgrind not installed"
command -v callgrind_annotate >/dev/null || die "callgrind_annotate not installed"

if [ "$TARGET" = haproxy ]; then
    command -v haproxy >/dev/null || die "haproxy not installed"
    build fake_broker pump_client
else
    build rebound fake_broker pump_client
    [ -x "$REBOUND" ] || die "no rebound binary at $REBOUND"
fi
# FRAMES_PER_MSG: what pump_client counts a message (read, or written when
# publishing); FWD_PER_MSG: what the proxy forwards a message, both ways.
FRAMES_PER_MSG=$((BODY > 0 ? 3 : 2))
FWD_PER_MSG=$FRAMES_PER_MSG
[ "$MODE" = ack ] && FWD_PER_MSG=$((FRAMES_PER_MSG + 1))
# retry: the delivery, the nack, the copy, its confirm, the ack of the original
[ "$MODE" = retry ] && FWD_PER_MSG=$((2 * FRAMES_PER_MSG + 3))
pump_mode_args "$MODE" "$PREFETCH" "$BODY"
FAKE_TLS=() CLIENT_TLS=()
if [ "$TLS" = 1 ]; then
    CERTS=$WORK/certs
    sh "$ROOT/tests/tls/make_certs.sh" "$CERTS" || die "cannot make certificates"
    cat "$CERTS/server.pem" "$CERTS/server.key" >"$CERTS/haproxy.pem"
    FAKE_TLS=(--tls-cert "$CERTS/server.pem" --tls-key "$CERTS/server.key")
    CLIENT_TLS=(--tls "$CERTS/ca.pem")
fi

# proxy_cmd LISTEN_PORT UPSTREAM_PORT TAG: the command line of the proxy
# under test (for haproxy, its configuration is written first).
proxy_cmd() {
    if [ "$TARGET" = haproxy ]; then
        local bind="127.0.0.1:$1" server="127.0.0.1:$2"
        if [ "$TLS" = 1 ]; then
            bind="$bind ssl crt $CERTS/haproxy.pem"
            server="$server ssl verify required ca-file $CERTS/ca.pem sni str(localhost) verifyhost localhost"
        fi
        haproxy_cfg "$bind" "$server" >"$WORK/haproxy.$3.cfg"
        echo haproxy -db -f "$WORK/haproxy.$3.cfg"
    elif [ "$TLS" = 1 ]; then
        echo "$REBOUND" --listen off --tls-listen "127.0.0.1:$1" \
            --tls-cert "$CERTS/server.pem" --tls-key "$CERTS/server.key" \
            --upstream "amqps://localhost:$2" --upstream-ca "$CERTS/ca.pem" \
            --admin off --log-level warn "${RETRY_FLAGS[@]}"
    else
        echo "$REBOUND" --listen "127.0.0.1:$1" --upstream "127.0.0.1:$2" \
            --admin off --log-level warn "${RETRY_FLAGS[@]}"
    fi
}

# one_run N TAG: sets RUN_IR, RUN_MEM (Ir in memcpy/memmove), RUN_FRAMES
# and RUN_CONNS (connections that sent fake_broker the protocol header:
# the session and the probes); the callgrind file is
# $WORK/cg.TAG.out.
one_run() {
    local n=$1 tag=$2 fake_pid rb_pid fake_port rb_port i line frames ir rc
    local out=$WORK/cg.$tag.out
    start_fake_broker "$tag" --messages "$n" --body-size "$BODY" "${FAKE_TLS[@]}"
    fake_pid=$FAKE_PID fake_port=$FAKE_PORT

    rb_port=$(free_port)
    local cmd
    cmd=$(proxy_cmd "$rb_port" "$fake_port" "$tag")
    local late=()
    [ "$TARGET" = haproxy ] && late=(--instr-atstart=no)
    # shellcheck disable=SC2086 # split on spaces on purpose: no path here holds one
    valgrind --tool=callgrind --callgrind-out-file="$out" "${late[@]}" \
        $cmd >"$WORK/rebound.$tag.log" 2>&1 &
    rb_pid=$!
    PIDS+=("$rb_pid")
    for ((i = 0; i < 600; i++)); do
        listening "$rb_port" && break
        kill -0 "$rb_pid" 2>/dev/null || { cat "$WORK/rebound.$tag.log" >&2; die "$TARGET exited"; }
        sleep 0.1
    done
    listening "$rb_port" || die "$TARGET does not listen on $rb_port after 60 s"
    if [ "${#late[@]}" -gt 0 ]; then
        callgrind_control -i on "$rb_pid" >/dev/null 2>&1 ||
            die "callgrind_control -i on $rb_pid failed"
    fi

    line=$("$BUILD/bench/pump_client" --port "$rb_port" --messages "$n" \
        --seconds 600 --label "$tag" "${CLIENT_TLS[@]}" "${PUMP_MODE_ARGS[@]}" |
        grep '^RESULT') || true
    echo "$line" >>"$WORK/results.txt"
    check_pump_line "$MODE" "$n" "$FRAMES_PER_MSG" "$line"
    frames=$(echo "$line" | sed -n 's/.* frames=\([0-9]*\).*/\1/p')

    kill -TERM "$rb_pid"
    rc=0
    for ((i = 0; i < 600; i++)); do
        kill -0 "$rb_pid" 2>/dev/null || break
        sleep 0.1
    done
    kill -0 "$rb_pid" 2>/dev/null && die "$TARGET still running 60 s after SIGTERM"
    wait "$rb_pid" || rc=$?
    kill -TERM "$fake_pid" 2>/dev/null || true
    wait "$fake_pid" || true
    PIDS=()
    [ "$TARGET" = haproxy ] && [ "$rc" = 143 ] && rc=0
    [ "$rc" = 0 ] || { tail -n 20 "$WORK/rebound.$tag.log" >&2; die "$TARGET exited with $rc"; }
    check_fake_log "$MODE" "$n" "$FRAMES_PER_MSG" "$WORK/fake.$tag.log"
    RUN_CONNS=$(sed -n 's/.* \([0-9]*\) sent the protocol header.*/\1/p' "$WORK/fake.$tag.log")
    ir=$(sed -n 's/^totals: *\([0-9]*\).*/\1/p' "$out")
    [ -n "$ir" ] || die "no totals line in $out"
    RUN_IR=$ir RUN_FRAMES=$frames
    RUN_MEM=$(callgrind_annotate --threshold=100 "$out" 2>/dev/null |
        awk '/:__mem(cpy|move)/ { gsub(",", "", $1); s += $1 } END { print s + 0 }')
    RUN_SET=$(callgrind_annotate --threshold=100 "$out" 2>/dev/null |
        awk '/:__memset/ { gsub(",", "", $1); s += $1 } END { print s + 0 }')
}

# idle_run SECS TAG: rebound under callgrind with no client for SECS
# seconds after it listens (only its readiness probe works); sets RUN_IR
# and RUN_CONNS (the probes that sent fake_broker the protocol header).
idle_run() {
    local secs=$1 tag=$2 fake_pid rb_pid fake_port rb_port i rc=0 cmd
    local out=$WORK/cg.$tag.out
    start_fake_broker "$tag" "${FAKE_TLS[@]}"
    fake_pid=$FAKE_PID fake_port=$FAKE_PORT
    rb_port=$(free_port)
    cmd=$(proxy_cmd "$rb_port" "$fake_port" "$tag")
    # shellcheck disable=SC2086 # split on spaces on purpose
    valgrind --tool=callgrind --callgrind-out-file="$out" \
        $cmd >"$WORK/rebound.$tag.log" 2>&1 &
    rb_pid=$!
    PIDS+=("$rb_pid")
    for ((i = 0; i < 600; i++)); do
        listening "$rb_port" && break
        kill -0 "$rb_pid" 2>/dev/null || die "rebound exited"
        sleep 0.1
    done
    sleep "$secs"
    kill -TERM "$rb_pid"
    for ((i = 0; i < 600; i++)); do
        kill -0 "$rb_pid" 2>/dev/null || break
        sleep 0.1
    done
    wait "$rb_pid" || rc=$?
    kill -TERM "$fake_pid" 2>/dev/null || true
    wait "$fake_pid" || true
    PIDS=()
    [ "$rc" = 0 ] || die "rebound exited with $rc"
    RUN_CONNS=$(sed -n 's/.* \([0-9]*\) sent the protocol header.*/\1/p' "$WORK/fake.$tag.log")
    RUN_IR=$(sed -n 's/^totals: *\([0-9]*\).*/\1/p' "$out")
    [ -n "$RUN_IR" ] || die "no totals line in $out"
}

if [ "$TARGET" = haproxy ]; then
    echo "# $(date -u +%Y-%m-%dT%H:%M:%SZ) $(uname -r), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
    echo "# measured: $(haproxy -v | head -n 1 | cut -d' ' -f1-3) ($(command -v haproxy)), TCP mode, nbthread 1"
else
    describe_rebound --binary
fi
echo "# $(valgrind --version), gcc $(gcc -dumpfullversion 2>/dev/null)"
[ "$TLS" = 1 ] && echo "# TLS on both sides: pump_client -TLS-> $TARGET -TLS-> fake_broker ($(openssl version))"
case $MODE in
    noack) echo "# mode noack: deliveries broker -> client, no acks" ;;
    ack) echo "# mode ack, prefetch $PREFETCH: deliveries broker -> client, one basic.ack each client -> broker" ;;
    publish) echo "# mode publish: basic.publish + header + body client -> broker, no confirms" ;;
    retry) echo "# mode retry, prefetch $PREFETCH: deliveries broker -> client, a basic.nack (requeue) each; rebound ${RETRY_FLAGS[*]}: a copy to the tier on its own channel (retry connection: ${RETRY_CONN:-default, separate}), confirmed, then the ack of the original" ;;
esac
echo "# body $BODY B ($FRAMES_PER_MSG frames a message), N1 $N1, N2 $N2, $REPEAT run(s) each"
: >"$WORK/results.txt"
declare -A IRS MEMS SETS CONNS
for n in "$N1" "$N2"; do
    for ((r = 1; r <= REPEAT; r++)); do
        t0=$SECONDS
        one_run "$n" "$n.$r"
        IRS[$n]="${IRS[$n]:-} $RUN_IR"
        MEMS[$n]="${MEMS[$n]:-} $RUN_MEM"
        SETS[$n]="${SETS[$n]:-} $RUN_SET"
        CONNS[$n]="${CONNS[$n]:-} $RUN_CONNS"
        echo "# run N=$n #$r: Ir $RUN_IR (memcpy/memmove $RUN_MEM), frames $RUN_FRAMES, $((SECONDS - t0)) s${RUN_CONNS:+, $RUN_CONNS connection(s) sent fake_broker the protocol header}"
    done
done
PER_PROBE=
# the probes are measured with TLS (a handshake each: they weigh), and
# without it when the runs of N1 and N2 saw different numbers of them
conns_sum() { local s=0 c; for c in $1; do s=$((s + c)); done; echo "$s"; }
if [ "$TARGET" = rebound ] && { [ "$TLS" = 1 ] ||
    [ "$(conns_sum "${CONNS[$N1]}")" != "$(conns_sum "${CONNS[$N2]}")" ]; }; then
    idle_run 3 idle-short
    ir_a=$RUN_IR c_a=$RUN_CONNS
    idle_run 13 idle-long
    echo "# rebound with no client: Ir $ir_a with $c_a probe(s), $RUN_IR with $RUN_CONNS"
    [ "$RUN_CONNS" -gt "$c_a" ] && PER_PROBE=$(((RUN_IR - ir_a) / (RUN_CONNS - c_a)))
    if [ "$TLS" = 1 ]; then
        echo "# one readiness probe (TCP, TLS handshake, header, connection.start): ${PER_PROBE:-?} Ir"
    else
        echo "# one readiness probe (TCP connect, header, connection.start): ${PER_PROBE:-?} Ir"
    fi
fi

"$PY" - "$N1" "$N2" "$FWD_PER_MSG" "${IRS[$N1]}" "${IRS[$N2]}" \
    "${MEMS[$N1]}" "${MEMS[$N2]}" "${SETS[$N1]}" "${SETS[$N2]}" "$TLS" \
    "${CONNS[$N1]}" "${CONNS[$N2]}" "$PER_PROBE" "$MODE" "$FRAMES_PER_MSG" \
    "$TARGET" "$BODY" "$PREFETCH" "$WORK/result.line" "${RETRY_CONN:-default}" <<'EOF'
import statistics as st, sys
n1, n2, fpm = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
mode, counted = sys.argv[14], int(sys.argv[15])
target, body, prefetch = sys.argv[16], sys.argv[17], sys.argv[18]
ir1 = [int(x) for x in sys.argv[4].split()]
ir2 = [int(x) for x in sys.argv[5].split()]
mem1 = [int(x) for x in sys.argv[6].split()]
mem2 = [int(x) for x in sys.argv[7].split()]
set1 = [int(x) for x in sys.argv[8].split()]
set2 = [int(x) for x in sys.argv[9].split()]
tls = sys.argv[10] == "1"
conns1 = [int(x) for x in sys.argv[11].split()]
conns2 = [int(x) for x in sys.argv[12].split()]
per_probe = int(sys.argv[13]) if sys.argv[13] else None
def spread(v):
    if len(v) < 2:
        return "one run"
    if len(set(v)) == 1:
        return "identical"
    return f"max-min {max(v) - min(v)} = {(max(v) - min(v)) / st.mean(v) * 100:.3f}%"
m1, m2 = st.mean(ir1), st.mean(ir2)
f1, f2 = n1 * fpm, n2 * fpm
print()
print(f"Ir(N1={n1}) = {m1:,.0f}  runs: {' '.join(f'{x:,}' for x in ir1)}  ({spread(ir1)})")
print(f"Ir(N2={n2}) = {m2:,.0f}  runs: {' '.join(f'{x:,}' for x in ir2)}  ({spread(ir2)})")
per = (m2 - m1) / (f2 - f1)
if mode == "ack":
    print(f"forwarded frames = {counted} N deliveries (broker -> client) + N acks "
          f"(client -> broker) = {fpm} N")
    print(f"Ir per delivered message = ({m2:,.0f} - {m1:,.0f}) / ({n2} - {n1}) = "
          f"{(m2 - m1) / (n2 - n1):.0f}")
elif mode == "retry":
    print(f"frames through rebound = {counted} N deliveries (broker -> client) + N nacks "
          f"(client -> rebound) + {counted} N copies (rebound -> broker) + N confirms "
          f"(broker -> rebound) + N acks of originals (rebound -> broker) = {fpm} N")
    print(f"Ir per retried message = ({m2:,.0f} - {m1:,.0f}) / ({n2} - {n1}) = "
          f"{(m2 - m1) / (n2 - n1):.0f}")
    if len(ir1) > 1 and len(ir2) > 1:
        print(f"  from the extreme runs: {(min(ir2) - max(ir1)) / (n2 - n1):.0f} .. "
              f"{(max(ir2) - min(ir1)) / (n2 - n1):.0f}")
elif mode == "publish":
    print(f"forwarded frames = {fpm} N (client -> broker: basic.publish + header"
          f"{' + body' if fpm == 3 else ''})")
print(f"Ir per forwarded frame = ({m2:,.0f} - {m1:,.0f}) / ({f2} - {f1}) = {per:.1f}"
      f"  (per message: {per * fpm:.0f})")
if len(ir1) > 1 and len(ir2) > 1:
    lo = (min(ir2) - max(ir1)) / (f2 - f1)
    hi = (max(ir2) - min(ir1)) / (f2 - f1)
    print(f"  from the extreme runs: {lo:.1f} .. {hi:.1f}")
mem = (st.mean(mem2) - st.mean(mem1)) / (f2 - f1)
print(f"  of which libc memcpy/memmove: {mem:.1f}; without them: {per - mem:.1f}")
if tls:
    mset = (st.mean(set2) - st.mean(set1)) / (f2 - f1)
    print(f"  libc memset: {mset:.1f}; without memcpy/memmove/memset: {per - mem - mset:.1f}")
if per_probe is not None:
    probes = st.mean(conns2) - st.mean(conns1)  # each run: 1 session + its probes
    corr = (m2 - m1 - probes * per_probe) / (f2 - f1)
    print(f"Ir per forwarded frame without the readiness probes ({probes:+.1f} probes "
          f"x {per_probe:,} Ir) = {corr:.1f}  (per message: {corr * fpm:.0f})")
    if len(ir1) > 1 and len(ir2) > 1:
        lo = min((b - a - (cb - ca) * per_probe) for b, cb in zip(ir2, conns2)
                 for a, ca in zip(ir1, conns1)) / (f2 - f1)
        hi = max((b - a - (cb - ca) * per_probe) for b, cb in zip(ir2, conns2)
                 for a, ca in zip(ir1, conns1)) / (f2 - f1)
        print(f"  from the extreme runs: {lo:.1f} .. {hi:.1f}")
    if mode == "retry":
        print(f"Ir per retried message without the readiness probes = "
              f"{(m2 - m1 - probes * per_probe) / (n2 - n1):.0f}")
    corr = f" ir_per_frame_without_probes={corr:.1f}"
else:
    corr = ""
with open(sys.argv[19], "w") as out:  # printed last
    print(f"RESULT target={target} mode={mode} body={body}"
          f"{' prefetch=' + prefetch if mode in ('ack', 'retry') else ''} n1={n1} n2={n2}"
          f" frames_per_msg={fpm} ir_per_frame={per:.1f} ir_per_msg={per * fpm:.0f}"
          f" memcpy_per_frame={mem:.1f}{corr}"
          f"{' retry_connection=' + sys.argv[20] if mode == 'retry' else ''}"
          f" conns={','.join(map(str, conns1))}/{','.join(map(str, conns2))}", file=out)
EOF

echo
echo "# top $TOP functions by self Ir, run N=$N2 #1 (callgrind_annotate):"
callgrind_annotate "$WORK/cg.$N2.1.out" 2>/dev/null |
    awk -v top="$TOP" '
        /file:function/ { on = 1; getline; next }
        on && NF == 0 { if (shown) exit; next }
        on && shown < top { print; shown++ }'

echo
if [ "$MODE" = retry ]; then
    echo "# top $TOP functions by self Ir per retried message, (run N=$N2 #1 - run N=$N1 #1) / (N2 - N1):"
    PER_UNITS=$((N2 - N1))
else
    echo "# top $TOP functions by self Ir per forwarded frame, (run N=$N2 #1 - run N=$N1 #1) / frames:"
    PER_UNITS=$(((N2 - N1) * FWD_PER_MSG))
fi
"$PY" - "$WORK/cg.$N1.1.out" "$WORK/cg.$N2.1.out" "$PER_UNITS" "$TOP" <<'EOF'
import re, subprocess, sys
def self_ir(path):
    out = subprocess.run(["callgrind_annotate", "--threshold=100", path],
                         capture_output=True, text=True, check=True).stdout
    res, on = {}, False
    for line in out.splitlines():
        if "file:function" in line:
            on = True
            continue
        m = re.match(r"\s*([\d,]+) \(\s*[\d.]+%\)\s+(.*?)(?: \[(.*)\])?$", line)
        if on and m:
            fn = m.group(2).split(":", 1)[-1]
            obj = (m.group(3) or "").rsplit("/", 1)[-1]
            key = f"{fn} [{obj}]" if obj else fn
            res[key] = res.get(key, 0) + int(m.group(1).replace(",", ""))
    return res
a, b = self_ir(sys.argv[1]), self_ir(sys.argv[2])
frames, top = int(sys.argv[3]), int(sys.argv[4])
rows = sorted(((b.get(k, 0) - a.get(k, 0)) / frames, k) for k in set(a) | set(b))
total = sum(v for v, _ in rows)
for v, k in rows[::-1][:top]:
    print(f"{v:9.1f} ({v / total * 100:5.1f}%)  {k}")
EOF

echo
cat "$WORK/result.line"
