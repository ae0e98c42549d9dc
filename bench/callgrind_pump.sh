#!/usr/bin/env bash
# callgrind_pump.sh - user-space instructions rebound executes per forwarded
# frame, without a broker, counted by callgrind (deterministic, unlike time).
#
#   bench/callgrind_pump.sh [--binary PATH] [--body-size B] [--small N1]
#                           [--large N2] [--repeat R] [--top K]
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
# --binary: the rebound to measure (default: build the tree, Release, in
# $REBOUND_BENCH_BUILD, default build-rel). fake_broker and pump_client are
# always built from the tree. Defaults: B 256, N1 20000, N2 60000. KEEP=1
# keeps the scratch directory with the callgrind.out files.
set -euo pipefail
. "$(dirname "$0")/bench_lib.sh"

BODY=256 N1=20000 N2=60000 REPEAT=2 TOP=10
usage="usage: $0 [--binary PATH] [--body-size B] [--small N1] [--large N2] [--repeat R] [--top K]"
while [ $# -gt 0 ]; do
    [ $# -ge 2 ] || die "$usage"
    case $1 in
        --binary) REBOUND_BIN=$(realpath "$2"); REBOUND=$REBOUND_BIN ;;
        --body-size) BODY=$2 ;;
        --small) N1=$2 ;;
        --large) N2=$2 ;;
        --repeat) REPEAT=$2 ;;
        --top) TOP=$2 ;;
        *) die "$usage" ;;
    esac
    shift 2
done
for v in "$BODY" "$N1" "$N2" "$REPEAT" "$TOP"; do
    [[ $v =~ ^[0-9]+$ ]] || die "$usage"
done
[ "$N1" -ge 1 ] && [ "$N2" -gt "$N1" ] || die "need 1 <= N1 < N2"
[ "$REPEAT" -ge 1 ] || die "--repeat R: R >= 1"
[ "$BODY" -le 131000 ] || die "--body-size B: at most 131000 (one body frame)"
command -v valgrind >/dev/null || die "valgrind not installed"
command -v callgrind_annotate >/dev/null || die "callgrind_annotate not installed"

build rebound fake_broker pump_client
[ -x "$REBOUND" ] || die "no rebound binary at $REBOUND"
FRAMES_PER_MSG=$((BODY > 0 ? 3 : 2))

# listening PORT: something listens on 127.0.0.1:PORT (asked of the kernel,
# not by connecting: a probe connection would be a session rebound counts).
listening() {
    [ -n "$(ss -Hltn "sport = :$1" 2>/dev/null)" ]
}

# one_run N TAG: sets RUN_IR, RUN_MEM (Ir in memcpy/memmove) and
# RUN_FRAMES; the callgrind file is $WORK/cg.TAG.out.
one_run() {
    local n=$1 tag=$2 fake_pid rb_pid fake_port="" rb_port i line frames ir rc
    local out=$WORK/cg.$tag.out
    "$BUILD/bench/fake_broker" --listen 127.0.0.1:0 --messages "$n" \
        --body-size "$BODY" --timeout 900 >"$WORK/fake.$tag.out" \
        2>"$WORK/fake.$tag.log" &
    fake_pid=$!
    PIDS+=("$fake_pid")
    for ((i = 0; i < 100; i++)); do
        fake_port=$(sed -n 's/^LISTENING //p' "$WORK/fake.$tag.out")
        [ -n "$fake_port" ] && break
        kill -0 "$fake_pid" 2>/dev/null || die "fake_broker exited: $(cat "$WORK/fake.$tag.log")"
        sleep 0.1
    done
    [ -n "$fake_port" ] || die "fake_broker did not say where it listens"

    rb_port=$(free_port)
    valgrind --tool=callgrind --callgrind-out-file="$out" \
        "$REBOUND" --listen "127.0.0.1:$rb_port" --upstream "127.0.0.1:$fake_port" \
        --admin off --log-level warn >"$WORK/rebound.$tag.log" 2>&1 &
    rb_pid=$!
    PIDS+=("$rb_pid")
    for ((i = 0; i < 600; i++)); do
        listening "$rb_port" && break
        kill -0 "$rb_pid" 2>/dev/null || { cat "$WORK/rebound.$tag.log" >&2; die "rebound exited"; }
        sleep 0.1
    done
    listening "$rb_port" || die "rebound does not listen on $rb_port after 60 s"

    line=$("$BUILD/bench/pump_client" --port "$rb_port" --messages "$n" \
        --seconds 600 --label "$tag" | grep '^RESULT') || true
    echo "$line" >>"$WORK/results.txt"
    [[ $line == *" status=ok "* ]] || die "pump_client: ${line:-no result}"
    frames=$(echo "$line" | sed -n 's/.* frames=\([0-9]*\).*/\1/p')
    [ "$frames" = $((n * FRAMES_PER_MSG)) ] ||
        die "pump_client counted $frames frames, expected $((n * FRAMES_PER_MSG))"
    [[ $line == *" extra=0"* ]] || die "frames after the last message: $line"

    kill -TERM "$rb_pid"
    rc=0
    for ((i = 0; i < 600; i++)); do
        kill -0 "$rb_pid" 2>/dev/null || break
        sleep 0.1
    done
    kill -0 "$rb_pid" 2>/dev/null && die "rebound still running 60 s after SIGTERM"
    wait "$rb_pid" || rc=$?
    kill -TERM "$fake_pid" 2>/dev/null || true
    wait "$fake_pid" || true
    PIDS=()
    [ "$rc" = 0 ] || { tail -n 20 "$WORK/rebound.$tag.log" >&2; die "rebound exited with $rc"; }
    grep -q "($n messages) written" "$WORK/fake.$tag.log" ||
        die "fake_broker: $(cat "$WORK/fake.$tag.log")"
    ir=$(sed -n 's/^totals: *\([0-9]*\).*/\1/p' "$out")
    [ -n "$ir" ] || die "no totals line in $out"
    RUN_IR=$ir RUN_FRAMES=$frames
    RUN_MEM=$(callgrind_annotate --threshold=100 "$out" 2>/dev/null |
        awk '/:__mem(cpy|move)/ { gsub(",", "", $1); s += $1 } END { print s + 0 }')
}

describe_rebound --binary
echo "# $(valgrind --version), gcc $(gcc -dumpfullversion 2>/dev/null)"
echo "# body $BODY B ($FRAMES_PER_MSG frames a message), N1 $N1, N2 $N2, $REPEAT run(s) each"
: >"$WORK/results.txt"
declare -A IRS MEMS
for n in "$N1" "$N2"; do
    for ((r = 1; r <= REPEAT; r++)); do
        t0=$SECONDS
        one_run "$n" "$n.$r"
        IRS[$n]="${IRS[$n]:-} $RUN_IR"
        MEMS[$n]="${MEMS[$n]:-} $RUN_MEM"
        echo "# run N=$n #$r: Ir $RUN_IR (memcpy/memmove $RUN_MEM), frames $RUN_FRAMES, $((SECONDS - t0)) s"
    done
done

"$PY" - "$N1" "$N2" "$FRAMES_PER_MSG" "${IRS[$N1]}" "${IRS[$N2]}" \
    "${MEMS[$N1]}" "${MEMS[$N2]}" <<'EOF'
import statistics as st, sys
n1, n2, fpm = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
ir1 = [int(x) for x in sys.argv[4].split()]
ir2 = [int(x) for x in sys.argv[5].split()]
mem1 = [int(x) for x in sys.argv[6].split()]
mem2 = [int(x) for x in sys.argv[7].split()]
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
print(f"Ir per forwarded frame = ({m2:,.0f} - {m1:,.0f}) / ({f2} - {f1}) = {per:.1f}"
      f"  (per message: {per * fpm:.0f})")
if len(ir1) > 1 and len(ir2) > 1:
    lo = (min(ir2) - max(ir1)) / (f2 - f1)
    hi = (max(ir2) - min(ir1)) / (f2 - f1)
    print(f"  from the extreme runs: {lo:.1f} .. {hi:.1f}")
mem = (st.mean(mem2) - st.mean(mem1)) / (f2 - f1)
print(f"  of which libc memcpy/memmove: {mem:.1f}; without them: {per - mem:.1f}")
EOF

echo
echo "# top $TOP functions by self Ir, run N=$N2 #1 (callgrind_annotate):"
callgrind_annotate "$WORK/cg.$N2.1.out" 2>/dev/null |
    awk -v top="$TOP" '
        /file:function/ { on = 1; getline; next }
        on && NF == 0 { if (shown) exit; next }
        on && shown < top { print; shown++ }'

echo
echo "# top $TOP functions by self Ir per forwarded frame, (run N=$N2 #1 - run N=$N1 #1) / frames:"
"$PY" - "$WORK/cg.$N1.1.out" "$WORK/cg.$N2.1.out" $(((N2 - N1) * FRAMES_PER_MSG)) "$TOP" <<'EOF'
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
