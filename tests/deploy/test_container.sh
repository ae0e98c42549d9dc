#!/usr/bin/env bash
# The container image (deploy/container): built by build.sh, then run with
# podman.
#
#   tests/deploy/test_container.sh
#
# Checks: the image's settings (non-root user, HEALTHCHECK, exposed ports,
# stop signal, entrypoint, OCI labels with the version of CMakeLists.txt);
# `IMAGE --version`; nothing of a build, a test broker or the repository
# in the image, and none of it in the build context (.dockerignore); flags
# given to the image add to its defaults (listen 0.0.0.0:5673, admin
# 0.0.0.0:9900); the process runs as 65532; the HEALTHCHECK passes, and
# fails against an address where no admin endpoint answers; SIGTERM from
# `podman stop` ends it with status 0. Then, with --network host in front of
# the RabbitMQ in REBOUND_TEST_BROKER (amqp://USER:PASS@HOST:PORT/ or
# HOST:PORT), a poison message through the container: nacked with requeue
# every time, delivered exactly max_attempts (3) times, 1 s apart, then in
# QUEUE.dlq.
#
# Exit 77 (skipped), with the reason: not root, podman, mmdebstrap or
# python3-pika missing, or podman cannot run containers here; without
# REBOUND_TEST_BROKER every check but the retry runs, then 77.
# REBOUND_CONTAINER_CACHE etc. go on to build.sh.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
t0=$(date +%s)
tmp=$(mktemp -d)
names=()
PY=/usr/bin/python3

skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*"; exit 1; }
step() { echo "== [$(( $(date +%s) - t0 ))s] $*"; }

# podman, its complaint that it cannot schedule periodic health checks
# where systemd does not run left out (`podman healthcheck run` works).
pm() {
  local rc=0
  podman "$@" 2>"$tmp/podman.err" || rc=$?
  grep -v "systemd connection" "$tmp/podman.err" >&2 || true
  return $rc
}

cleanup() {
  local n
  for n in "${names[@]}"; do
    podman rm -f -t 0 "$n" >/dev/null 2>&1 || true
  done
  rm -rf "$tmp"
}
trap cleanup EXIT

[ "$(id -u)" -eq 0 ] || skip "needs root (rootful podman, mmdebstrap)"
command -v podman >/dev/null || skip "podman not installed (apt-get install podman)"
command -v mmdebstrap >/dev/null ||
  podman image exists "${REBOUND_CONTAINER_BASE:-localhost/rebound-base:bookworm}" ||
  skip "mmdebstrap not installed (apt-get install mmdebstrap)"
"$PY" -c 'import pika' 2>/dev/null || skip "python3-pika not installed"

version=$(sed -n 's/^project(rebound VERSION \([0-9.]*\).*/\1/p' "$root/CMakeLists.txt")

# --- build ------------------------------------------------------------------------
step "build (deploy/container/build.sh)"
rc=0
"$root/deploy/container/build.sh" >"$tmp/build.out" 2>"$tmp/build.log" || rc=$?
if [ "$rc" -eq 3 ]; then
  skip "$(grep '^build.sh:' "$tmp/build.log" | tail -n 1)"
elif [ "$rc" -ne 0 ]; then
  tail -n 40 "$tmp/build.log"
  fail "build.sh exited $rc"
fi
while IFS='=' read -r key value; do
  case $key in
    REBOUND_IMAGE) image=$value ;;
    CONTAINERS_CONF) export CONTAINERS_CONF="$value" ;;
    REBOUND_CONTAINER_STORE_LOCK) store_lock=$value ;;
  esac
done <"$tmp/build.out"
[ -n "${image:-}" ] || fail "build.sh named no image"
grep '^build.sh:' "$tmp/build.log" | sed 's/^/   /'
# A build leaves no untagged image of rebound's behind: its build stage is
# tagged, and what earlier builds left is removed. Read under build.sh's
# store lock, so that another run's build is never caught half-way.
[ -n "${store_lock:-}" ] || fail "build.sh named no store lock"
left=$(flock -w 1800 "$store_lock" sh -c '
  for label in io.rebound.stage=build org.opencontainers.image.title=rebound; do
    podman images --quiet --filter dangling=true --filter "label=$label"
  done' | sort -u)
[ -z "$left" ] || fail "untagged images left by the build: $(echo $left)"
echo "   image $image${CONTAINERS_CONF:+ (CONTAINERS_CONF=$CONTAINERS_CONF)}"

# --- the image's settings ---------------------------------------------------------
step "image settings"
podman image inspect "$image" >"$tmp/inspect.json"
revision=$(git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)
[ "$revision" = unknown ] || git -C "$root" diff --quiet HEAD -- ||
  revision=$revision-dirty
"$PY" - "$tmp/inspect.json" "$version" "$revision" <<'EOF' || fail "image settings"
import json, sys
img = json.load(open(sys.argv[1]))[0]
cfg, version = img["Config"], sys.argv[2]
labels = cfg.get("Labels") or {}
errors = []
def want(what, got, expected):
    if got != expected:
        errors.append("%s: %r, expected %r" % (what, got, expected))
want("User", cfg.get("User"), "65532:65532")
want("ExposedPorts", sorted(cfg.get("ExposedPorts") or {}), ["5673/tcp", "9900/tcp"])
want("StopSignal", cfg.get("StopSignal"), "SIGTERM")
want("Entrypoint", cfg.get("Entrypoint"), ["/usr/local/bin/rebound"])
want("Cmd", cfg.get("Cmd") or [], [])
want("REBOUND_CONFIG", [e for e in cfg.get("Env", []) if e.startswith("REBOUND_CONFIG=")],
     ["REBOUND_CONFIG=/etc/rebound/rebound.yaml"])
want("HEALTHCHECK", (img.get("Healthcheck") or img.get("HealthCheck") or {}).get("Test"),
     ["CMD", "/usr/local/libexec/rebound/healthcheck"])
want("label version", labels.get("org.opencontainers.image.version"), version)
want("label title", labels.get("org.opencontainers.image.title"), "rebound")
want("label revision", labels.get("org.opencontainers.image.revision"), sys.argv[3])
for k in ("created", "description", "base.name"):
    if not labels.get("org.opencontainers.image." + k):
        errors.append("no label org.opencontainers.image." + k)
if errors:
    print("\n".join("   " + e for e in errors))
    sys.exit(1)
print("   user 65532:65532, ports 5673 9900, SIGTERM, healthcheck, version %s, %d MB"
      % (version, img["Size"] // 1000000))
EOF

step "podman run IMAGE --version"
out=$(pm run --rm --network none "$image" --version 2>"$tmp/version.err") ||
  fail "podman run $image --version: $(cat "$tmp/version.err")"
echo "   $out"
[[ $out == "rebound $version "* ]] || fail "--version printed: $out"

# --- what is in the image, and in the build context ------------------------------
step "no build, broker or repository leftovers in the image"
# as root, to see into every directory
# shellcheck disable=SC2016 # expanded by the container's shell
out=$(pm run --rm --network none --user 0 --entrypoint /bin/sh "$image" -c '
  for d in /src /build /work /root/.erlang.cookie; do
    [ -e "$d" ] && echo "present: $d"
  done
  ls -A /usr/local/src | sed "s|^|in /usr/local/src: |"
  ls -A /root | grep -vxE "\.bashrc|\.profile" | sed "s|^|in /root: |"
  find / -xdev \( -name .erlang.cookie -o -name cookie -o -name mnesia \
    -o -name CMakeCache.txt -o -name CMakeFiles -o -name CMakeLists.txt \
    -o -name node_modules -o -name .git -o -name "*.o" -o -name "*.a" \
    -o -name "crash-*" -o -name "*.pem" -a -path "*/tls/*" \) -print
  for p in gcc cpp cmake make pkg-config libc6-dev libuv1-dev libssl-dev \
           libyaml-dev node-llhttp nodejs perl; do
    dpkg-query -W -f "\${Status}" "$p" 2>/dev/null | grep -q "ok installed" &&
      echo "package: $p"
  done
  ldd /usr/local/bin/rebound | grep "not found"
  ls /usr/local/bin | grep -vx rebound | sed "s|^|extra: /usr/local/bin/|"
  true' 2>"$tmp/list.err") || fail "listing the image: $out $(cat "$tmp/list.err")"
[ -z "$out" ] || { echo "$out" | sed 's/^/   /'; fail "leftovers in the image"; }
echo "   none: no /src, /build, cookies, CMake files, .git, node_modules, compilers or -dev packages"

step "build context (.dockerignore)"
base=$(podman image inspect --format '{{index .Labels "org.opencontainers.image.base.name"}}' "$image")
cat >"$tmp/Containerfile.context" <<'EOF'
ARG BASE
FROM ${BASE}
COPY . /ctx
RUN cd /ctx && bad=$(find . \( -path ./.git -o -path './build*' -o -path './cmake-build*' \
      -o -name node_modules -o -name .erlang.cookie -o -name cookie -o -name mnesia \
      -o -name CMakeCache.txt -o -name __pycache__ -o -path ./tests \
      -o -name 'crash-*' -o -name '*.o' \) -print) \
 && { [ -z "$bad" ] || { echo "in the context: $bad"; exit 1; }; } \
 && test -f CMakeLists.txt && test -d src && test -f deploy/container/rebound.yaml \
 && echo "context: $(find . -type f | wc -l) files, $(du -sk . | cut -f1) KiB"
EOF
if ! podman build --layers=false --network none --pull=never --build-arg "BASE=$base" \
      -f "$tmp/Containerfile.context" --iidfile "$tmp/ctx.iid" "$root" >"$tmp/ctx.log" 2>&1; then
  tail -n 20 "$tmp/ctx.log"
  fail "the build context holds what .dockerignore should leave out"
fi
grep '^context:' "$tmp/ctx.log" | sed 's/^/   /'
podman rmi -f "$(cat "$tmp/ctx.iid")" >/dev/null 2>&1 || true

# --- defaults, flags, user, healthcheck, stop ----------------------------------
# wait_log NAME PATTERN: up to 15 s for the container's log to match.
wait_log() {
  local i
  for ((i = 0; i < 150; i++)); do
    podman logs "$1" 2>&1 | grep -q -- "$2" && return 0
    [ "$(podman inspect --format '{{.State.Running}}' "$1" 2>/dev/null)" = true ] || break
    sleep 0.1
  done
  podman logs "$1" 2>&1 | tail -n 20 | sed 's/^/   | /'
  return 1
}

step "flags add to the image's defaults (--network none, --upstream only)"
c1=rebound-test-defaults-$$
names+=("$c1")
pm run -d --name "$c1" --network none "$image" \
  --upstream 192.0.2.1:5672 --connect-timeout 500ms >/dev/null 2>"$tmp/run1.err" ||
  fail "podman run: $(tail -n 1 "$tmp/run1.err")"
wait_log "$c1" "msg=admin_listening" || fail "rebound did not start in the container"
log1=$(podman logs "$c1" 2>&1)
for want in "msg=config file=/etc/rebound/rebound.yaml" "upstreams=192.0.2.1:5672" \
            "msg=listening address=0.0.0.0:5673" "msg=admin_listening address=0.0.0.0:9900"; do
  grep -qF -- "$want" <<<"$log1" || { echo "$log1" | sed 's/^/   | /'; fail "log lacks: $want"; }
done
echo "   listening 0.0.0.0:5673, admin 0.0.0.0:9900 (from the image), upstream 192.0.2.1:5672 (flag)"

step "runs as non-root"
pid=$(podman inspect --format '{{.State.Pid}}' "$c1")
uids=$(awk '/^Uid:/ { print $2, $3, $4, $5 }' "/proc/$pid/status")
gids=$(awk '/^Gid:/ { print $2, $3, $4, $5 }' "/proc/$pid/status")
if [ "$uids" != "65532 65532 65532 65532" ] || [ "$gids" != "65532 65532 65532 65532" ]; then
  fail "rebound (host pid $pid) runs as uid $uids gid $gids"
fi
top=$(podman top "$c1" user huser group args)
echo "$top" | sed 's/^/   /'
echo "$top" | awk 'NR > 1 && ($1 != "rebound" || $2 != "65532") { bad = 1 } END { exit bad }' ||
  fail "podman top shows a process not run by rebound (65532)"

step "HEALTHCHECK"
out=$(podman healthcheck run "$c1" 2>&1) || {
  podman exec "$c1" /usr/local/libexec/rebound/healthcheck 2>&1 | sed 's/^/   | /'
  fail "podman healthcheck run: ${out:-unhealthy}"
}
echo "   podman healthcheck run: ${out:-healthy} ($(podman exec "$c1" /usr/local/libexec/rebound/healthcheck))"
state=$(podman inspect --format '{{.State.Health.Status}}' "$c1" 2>/dev/null ||
        podman inspect --format '{{.State.Healthcheck.Status}}' "$c1")
[ "$state" = healthy ] || fail "health status after a passing check: $state"
if out=$(podman exec "$c1" /usr/local/libexec/rebound/healthcheck 127.0.0.1:1 2>&1); then
  fail "the healthcheck passed against a port without an admin endpoint: $out"
fi
echo "   against 127.0.0.1:1: $out"

step "podman stop: SIGTERM, exit 0"
s0=$(date +%s)
pm stop -t 20 "$c1" >/dev/null
code=$(podman inspect --format '{{.State.ExitCode}}' "$c1")
grep -q "msg=shutdown signal=15" <<<"$(podman logs "$c1" 2>&1)" ||
  fail "no shutdown on SIGTERM in the log"
[ "$code" = 0 ] || fail "rebound exited $code on podman stop"
echo "   exit 0 after $(( $(date +%s) - s0 ))s"
pm rm -f "$c1" >/dev/null

# --- a poison message through the container -------------------------------------
if [ -z "${REBOUND_TEST_BROKER:-}" ]; then
  step "done in $(( $(date +%s) - t0 ))s"
  skip "retry through the container not run: REBOUND_TEST_BROKER not set (scripts/broker.sh start DIR); the other checks passed"
fi
hostport=${REBOUND_TEST_BROKER#*://}
hostport=${hostport#*@}
hostport=${hostport%%/*}
broker_url=${REBOUND_TEST_BROKER}
[[ $broker_url == amqp://* ]] || broker_url=amqp://guest:guest@$hostport/

step "retry through the container (--network host, upstream $hostport)"
read -r port admin < <("$PY" "$here/free_ports.py" 2)
queue=rebound-ct-poison-$$-$RANDOM
c2=rebound-test-retry-$$
names+=("$c2")
pm run --rm -d --name "$c2" --network host "$image" \
  --upstream "$hostport" --listen "127.0.0.1:$port" --admin "127.0.0.1:$admin" \
  --retry-queues "rebound-ct-poison-*" --retry-tiers 1s --max-attempts 3 \
  --log-level debug \
  >/dev/null 2>"$tmp/run2.err" || fail "podman run: $(tail -n 1 "$tmp/run2.err")"
wait_log "$c2" "msg=admin_listening address=127.0.0.1:$admin" ||
  fail "rebound did not start in the container"
out=$(podman healthcheck run "$c2" 2>&1) ||
  fail "podman healthcheck run (admin on 127.0.0.1:$admin): ${out:-unhealthy}"
echo "   listening 127.0.0.1:$port, admin 127.0.0.1:$admin, healthcheck passes"

"$PY" - "$port" "$admin" "$broker_url" "$queue" <<'EOF' || fail "retry through the container"
import sys, time, urllib.request
import pika

port, admin, broker_url, q = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
MAX, TIER = 3, 1.0
dlq, tier = q + ".dlq", q + ".retry.1s"

def until(cond, timeout, what):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(0.2)
    raise SystemExit("FAIL: timed out: " + what)

def ready():
    try:
        return urllib.request.urlopen("http://127.0.0.1:%s/readyz" % admin, timeout=2).status == 200
    except OSError:
        return False
until(ready, 15, "/readyz 200 (rebound in the container reaching the broker)")

direct = pika.BlockingConnection(pika.URLParameters(broker_url))
dch = direct.channel()
def count(name):
    return dch.queue_declare(name, durable=True, passive=True).method.message_count

proxy = pika.BlockingConnection(pika.URLParameters(
    "amqp://guest:guest@127.0.0.1:%s/%%2F?socket_timeout=10" % port))
try:
    ch = proxy.channel()
    ch.queue_declare(q, durable=True)
    ch.confirm_delivery()
    ch.basic_publish("", q, b"poison", pika.BasicProperties(delivery_mode=2))
    seen = []                  # (time of the nack, rebound-retry-count)
    end = time.monotonic() + 30
    for method, props, body in ch.consume(q, inactivity_timeout=0.5):
        if method is not None:
            assert body == b"poison", body
            c = (props.headers or {}).get("rebound-retry-count")
            c = None if c is None else int(c)
            seen.append((time.monotonic(), c))
            ch.basic_nack(method.delivery_tag, requeue=True)
            print("   delivery %d, rebound-retry-count %s: nack, requeue" % (len(seen), c))
        elif len(seen) >= MAX and count(dlq) == 1:
            # one tier delay more: a 4th delivery would have come by now
            if time.monotonic() - seen[-1][0] > TIER + 1.5:
                break
        if time.monotonic() > end:
            break
    ch.cancel()
    counts = [c for _, c in seen]
    gaps = [round(b[0] - a[0], 2) for a, b in zip(seen, seen[1:])]
    print("   deliveries %d, counts %s, gaps %s s" % (len(seen), counts, gaps))
    assert len(seen) == MAX, "delivered %d times, expected %d" % (len(seen), MAX)
    assert counts == [None, 1, 2], counts
    assert all(TIER - 0.05 <= g <= TIER + 2.0 for g in gaps), gaps
    assert count(q) == 0, "%d left in %s" % (count(q), q)
    assert count(dlq) == 1, "%d in %s" % (count(dlq), dlq)
    m, p, body = dch.basic_get(dlq, auto_ack=False)
    assert body == b"poison" and p.headers.get("rebound-retry-count") == MAX, (body, p.headers)
    dch.basic_nack(m.delivery_tag, requeue=True)
    print("   %s: 1 message, body and rebound-retry-count %d" % (dlq, MAX))
finally:
    try:
        proxy.close()
    except Exception:
        pass
    for name in (q, dlq, tier):
        try:
            direct.channel().queue_delete(name)
        except Exception:
            pass
    direct.close()
EOF
log2=$(podman logs "$c2" 2>&1)
grep -q "msg=dead_lettered" <<<"$log2" || fail "no dead_lettered line in the container's log"
[ "$(grep -c "msg=retry_published" <<<"$log2")" -eq 2 ] ||
  fail "expected 2 retry_published lines: $(grep "msg=retry_published" <<<"$log2")"
pm stop -t 20 "$c2" >/dev/null
step "passed in $(( $(date +%s) - t0 ))s"
