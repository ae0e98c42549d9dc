#!/usr/bin/env bash
# Private RabbitMQ node for tests (Debian's rabbitmq-server, run as root).
#
#   scripts/broker.sh start DIR   start (or reuse) a node whose state lives in DIR;
#                                 last stdout line: REBOUND_TEST_BROKER=amqp://...
#   scripts/broker.sh stop DIR    stop it (idempotent)
#
# The node also listens for AMQP over TLS (REBOUND_TEST_BROKER_TLS_PORT in env), with
# the certificates of tests/tls/make_certs.sh in DIR/tls (REBOUND_TEST_CERTS): the
# server's certificate names localhost and 127.0.0.1, signed by DIR/tls/ca.pem.
# Its only plugin, rabbitmq_prometheus, serves the broker's own metrics on
# 127.0.0.1:REBOUND_TEST_BROKER_PROMETHEUS_PORT (the alert rules' tests read them).
#
# Files in DIR: env (sourceable: RABBITMQ_* for rabbitmqctl + REBOUND_TEST_BROKER),
# url, rabbitmqctl (wrapper that sources env), rabbitmq.conf, enabled_plugins,
# cookie, launcher.pid (process group of the node), rabbitmq.pid (beam), log/, mnesia/.
#
# The node is named rebound-test-<amqp port>@localhost (short name, resolves through
# /etc/hosts, independent of the machine's hostname), listens on 127.0.0.1 only and
# uses a private Erlang cookie passed with -setcookie, so neither $HOME nor
# /root/.erlang.cookie nor /var/lib/rabbitmq is read or written.
#
# Environment: REBOUND_BROKER_START_TIMEOUT (s, default 90),
# REBOUND_BROKER_STOP_TIMEOUT (s, default 30), REBOUND_BROKER_LAUNCH_DELAY
# (s the launcher waits before it starts the node; 0, for tests),
# REBOUND_BROKER_OWNER (a pid: the node started belongs to that process, a
# test; once it is gone, killed by a timeout included, a watcher of its own
# session stops the node, and the watcher ends with the node).
set -euo pipefail

RMQ_BIN=/usr/lib/rabbitmq/bin
HERE=$(cd "$(dirname "$0")" && pwd)
PY=$(command -v /usr/bin/python3 || command -v python3)
START_TIMEOUT=${REBOUND_BROKER_START_TIMEOUT:-90}
STOP_TIMEOUT=${REBOUND_BROKER_STOP_TIMEOUT:-30}

die() { echo "broker.sh: $*" >&2; exit 1; }
log() { echo "broker.sh: $*" >&2; }

usage() { die "usage: $0 start|stop DIR"; }
[ $# -eq 2 ] || [ "${1:-}" = watch ] || usage
cmd=$1

# --- small helpers -------------------------------------------------------------

# port_free PORT: true if nothing listens on 127.0.0.1:PORT (bind test, like Erlang's
# listener: SO_REUSEADDR so TIME_WAIT leftovers do not count as busy).
port_free() {
    "$PY" - "$1" <<'EOF'
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
try:
    s.bind(("127.0.0.1", int(sys.argv[1])))
except OSError:
    sys.exit(1)
EOF
}

# free_port: a port that is free now, below the kernel's ephemeral range (so no
# outgoing connection of another test takes it while a node is down and is to
# come back on it); avoids epmd (4369) and rabbitmqctl's own (35672-35682).
free_port() {
    "$PY" - <<'EOF'
import random, socket
lo = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
for _ in range(1000):
    p = random.randrange(20000, min(lo, 32768))
    if p == 4369 or 35672 <= p <= 35682:
        continue
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(("127.0.0.1", p))
    except OSError:
        continue
    finally:
        s.close()
    print(p)
    break
EOF
}

# amqp_ok PORT: true if the broker answers the 0-9-1 protocol header with
# connection.start (it only listens once fully booted).
amqp_ok() {
    "$PY" - "$1" <<'EOF'
import socket, struct, sys
try:
    s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=3)
    s.sendall(b"AMQP\x00\x00\x09\x01")
    buf = b""
    while len(buf) < 11:
        chunk = s.recv(64)
        if not chunk:
            sys.exit(1)
        buf += chunk
    s.close()
    ftype, chan, _size, cls, meth = struct.unpack(">BHIHH", buf[:11])
    sys.exit(0 if (ftype, chan, cls, meth) == (1, 0, 10, 10) else 1)
except OSError:
    sys.exit(1)
EOF
}

# alive PID: PID runs and is one of ours (rabbitmq-server script or its beam), so a
# recycled pid from a stale pid file is never mistaken for the node.
alive() {
    [ -n "${1:-}" ] && kill -0 "$1" 2>/dev/null &&
        tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null | grep -q rabbit
}

# running PID: a process this script just started has not exited (a zombie
# counts as exited). Unlike alive, it holds before the launcher has
# exec'd rabbitmq-server, while its command line is still this script's.
running() {
    [ -n "${1:-}" ] && kill -0 "$1" 2>/dev/null &&
        ! grep -q '^State:[[:space:]]*Z' "/proc/$1/status" 2>/dev/null
}

readpid() { [ -s "$1" ] && tr -dc '0-9' <"$1" || true; }

# starttime PID: when PID started (clock ticks since boot), which tells it
# from a later process that reuses its number; fails if PID is gone.
starttime() {
    local stat
    stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
    stat=${stat##*) }                  # the fields after "(comm) "
    set -- $stat
    echo "${20}"
}

# watch OWNER SINCE LAUNCHER DIR (run by start, in a session of its own):
# stop the node in DIR once OWNER, started at SINCE, is gone; end when the
# node's launcher is gone (the node stopped or started again).
if [ "${1:-}" = watch ] && [ $# -eq 5 ]; then
    exec 0</dev/null >/dev/null 2>&1
    while [ "$(starttime "$2" || true)" = "$3" ]; do
        running "$4" || exit 0
        sleep 1
    done
    running "$4" || exit 0
    exec "$0" stop "$5"
fi

# --- main ----------------------------------------------------------------------

mkdir -p "$2"
DIR=$(cd "$2" && pwd)
ENV_FILE=$DIR/env

# Stop everything recorded in DIR. Safe to call when nothing runs.
do_stop() {
    [ -f "$ENV_FILE" ] || return 0
    local lpid bpid i
    lpid=$(readpid "$DIR/launcher.pid")
    bpid=$(readpid "$DIR/rabbitmq.pid")
    if alive "$bpid" || alive "$lpid"; then
        # Graceful: the node deregisters from epmd and flushes mnesia.
        ( set +u; . "$ENV_FILE"; HOME=$DIR/home \
            timeout "$STOP_TIMEOUT" "$RMQ_BIN/rabbitmqctl" stop >/dev/null 2>&1 9>&- ) \
            || log "rabbitmqctl stop failed, killing"
        for ((i = 0; i < STOP_TIMEOUT * 5; i++)); do
            alive "$bpid" || alive "$lpid" || break
            sleep 0.2
        done
        # Still there: TERM then KILL the whole process group (launcher is a setsid leader).
        if alive "$lpid" || alive "$bpid"; then
            [ -n "$lpid" ] && kill -TERM -- "-$lpid" 2>/dev/null || true
            [ -n "$bpid" ] && kill -TERM "$bpid" 2>/dev/null || true
            sleep 3
            [ -n "$lpid" ] && kill -KILL -- "-$lpid" 2>/dev/null || true
            [ -n "$bpid" ] && kill -KILL "$bpid" 2>/dev/null || true
        fi
    fi
    rm -f "$DIR/launcher.pid" "$DIR/rabbitmq.pid"
    # epmd drops a registration when the node's socket closes; check it is gone.
    local name
    name=$(set +u; . "$ENV_FILE"; echo "${RABBITMQ_NODENAME%@*}")
    for ((i = 0; i < 25; i++)); do
        epmd -names 2>/dev/null | grep -q "^name $name " || return 0
        sleep 0.2
    done
    log "warning: $name still registered in epmd"
}

do_start() {
    local lpid bpid port dist tlsport promport cookie node i attempt reuse=0
    # Reuse a node already running for DIR (or wait for one that is booting).
    if [ -f "$ENV_FILE" ]; then
        port=$(set +u; . "$ENV_FILE"; echo "$RABBITMQ_NODE_PORT")
        lpid=$(readpid "$DIR/launcher.pid")
        bpid=$(readpid "$DIR/rabbitmq.pid")
        if alive "$lpid" || alive "$bpid"; then
            if amqp_ok "$port"; then
                log "reusing running node in $DIR"
                report "$port"
                return 0
            fi
            log "node in $DIR is running but not answering yet; waiting"
            wait_up "$port" "$lpid" && { report "$port"; return 0; }
            log "restarting it"
        fi
        do_stop
    fi

    # AMQP port: the previous one for DIR if free (same node name, keeps its data),
    # else 5672 if free, else any free port.
    # A node restarted in its DIR must come back on its port: the port names
    # the node, and the node name its data. Wait for it to be free.
    if [ -n "${port:-}" ]; then
        reuse=1
        for ((i = 0; i < 150; i++)); do
            port_free "$port" && break
            sleep 0.2
        done
        port_free "$port" || die "port $port of the node in $DIR stays taken"
    else
        port=5672
        port_free "$port" || port=$(free_port)
    fi
    # Start it; a node that exits while starting gets two more tries.
    for ((attempt = 1; ; attempt++)); do
    dist=$(free_port)
    while [ "$dist" = "$port" ]; do dist=$(free_port); done
    tlsport=$(free_port)
    while [ "$tlsport" = "$port" ] || [ "$tlsport" = "$dist" ]; do
        tlsport=$(free_port)
    done
    promport=$(free_port)
    while [ "$promport" = "$port" ] || [ "$promport" = "$dist" ] ||
        [ "$promport" = "$tlsport" ]; do
        promport=$(free_port)
    done
    sh "$HERE/../tests/tls/make_certs.sh" "$DIR/tls" || die "cannot make certificates"
    node=rebound-test-$port@localhost
    if [ -s "$DIR/cookie" ]; then
        cookie=$(cat "$DIR/cookie")
    else
        cookie=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' | tr 'a-f' 'A-F')
        (umask 077; echo "$cookie" >"$DIR/cookie")
    fi

    mkdir -p "$DIR/log" "$DIR/mnesia" "$DIR/home"
    echo "[rabbitmq_prometheus]." >"$DIR/enabled_plugins"
    : >"$DIR/rabbitmq-env.conf"        # ignore /etc/rabbitmq/rabbitmq-env.conf
    cat >"$DIR/rabbitmq.conf" <<'EOF'
# private test node (scripts/broker.sh); listener/port come from the environment
loopback_users.guest = true
# default would be <node>@<machine hostname>: keep connection.start host-independent
cluster_name = rebound-test
log.console = false
log.file.level = info
EOF
    cat >>"$DIR/rabbitmq.conf" <<EOF
listeners.ssl.default = 127.0.0.1:$tlsport
ssl_options.cacertfile = $DIR/tls/ca.pem
ssl_options.certfile = $DIR/tls/server.pem
ssl_options.keyfile = $DIR/tls/server.key
ssl_options.verify = verify_none
ssl_options.fail_if_no_peer_cert = false
prometheus.tcp.ip = 127.0.0.1
prometheus.tcp.port = $promport
EOF

    # Everything rabbitmq-server and rabbitmqctl need; sourceable by tests.
    cat >"$ENV_FILE" <<EOF
# generated by scripts/broker.sh; source before running $RMQ_BIN/rabbitmqctl
export RABBITMQ_NODENAME=$node
export RABBITMQ_USE_LONGNAME=false
export RABBITMQ_NODE_IP_ADDRESS=127.0.0.1
export RABBITMQ_NODE_PORT=$port
export RABBITMQ_DIST_PORT=$dist
export RABBITMQ_MNESIA_BASE=$DIR/mnesia
export RABBITMQ_LOG_BASE=$DIR/log
export RABBITMQ_PID_FILE=$DIR/rabbitmq.pid
export RABBITMQ_ENABLED_PLUGINS_FILE=$DIR/enabled_plugins
export RABBITMQ_CONFIG_FILE=$DIR/rabbitmq.conf
export RABBITMQ_ADVANCED_CONFIG_FILE=$DIR/advanced.config
export RABBITMQ_CONF_ENV_FILE=$DIR/rabbitmq-env.conf
export RABBITMQ_CTL_ERL_ARGS="-setcookie $cookie"
export ERL_EPMD_ADDRESS=127.0.0.1
export REBOUND_TEST_BROKER=amqp://guest:guest@127.0.0.1:$port/
# Same with the vhost spelled out: bunny and librabbitmq read a bare trailing "/" as
# vhost "" (pika and kombu read it as "/").
export REBOUND_TEST_BROKER_VHOST_URL=amqp://guest:guest@127.0.0.1:$port/%2F
export REBOUND_TEST_BROKER_TLS_PORT=$tlsport
export REBOUND_TEST_BROKER_PROMETHEUS_PORT=$promport
export REBOUND_TEST_CERTS=$DIR/tls
EOF
    echo "amqp://guest:guest@127.0.0.1:$port/" >"$DIR/url"
    cat >"$DIR/rabbitmqctl" <<EOF
#!/bin/sh
# rabbitmqctl against the private node in $DIR
. "$ENV_FILE"
HOME="$DIR/home" exec $RMQ_BIN/rabbitmqctl "\$@"
EOF
    chmod +x "$DIR/rabbitmqctl"
    rm -f "$DIR/rabbitmq.pid"

    # Launch detached in its own session/process group; the rabbitmq-server script
    # stays as parent of beam.smp and turns SIGTERM into a clean shutdown.
    (
        set +u
        . "$ENV_FILE"
        export HOME=$DIR/home ERL_CRASH_DUMP=$DIR/log/erl_crash.dump
        export RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-setcookie $cookie -kernel inet_dist_use_interface {127,0,0,1}"
        cd "$DIR"
        exec 9>&- 8>&-   # the node must not hold the locks
        # a slow fork-to-exec, as on a loaded machine (tests set it)
        sleep "${REBOUND_BROKER_LAUNCH_DELAY:-0}"
        exec setsid nohup "$RMQ_BIN/rabbitmq-server" \
            >>"$DIR/log/startup.log" 2>&1 </dev/null
    ) &
    lpid=$!
    echo "$lpid" >"$DIR/launcher.pid"
    log "starting $node (amqp $port, dist $dist), state in $DIR"

    if wait_up "$port" "$lpid"; then
        break
    fi
    if running "$lpid" || [ "$attempt" -ge 3 ]; then
        log "broker did not come up within ${START_TIMEOUT}s; log tail:"
        tail -n 40 "$DIR"/log/*.log >&2 || true
        do_stop
        exit 1
    fi
    # It exited while starting (seen when nodes of concurrent tests start at
    # the same moment): once more, on other ports unless its port names it.
    log "broker exited while starting (attempt $attempt); log tail:"
    tail -n 20 "$DIR"/log/*.log >&2 || true
    do_stop
    [ "$reuse" = 1 ] || port=$(free_port)
    sleep 1
    done
    watch_owner "$lpid"
    report "$port"
}

# The node just started belongs to REBOUND_BROKER_OWNER, if set: a watcher
# stops it once that process is gone.
watch_owner() {
    local owner=${REBOUND_BROKER_OWNER:-} since
    [ -n "$owner" ] || return 0
    since=$(starttime "$owner") || {
        log "owner $owner is gone; stopping the node"
        do_stop
        exit 1
    }
    setsid "$HERE/broker.sh" watch "$owner" "$since" "$1" "$DIR" \
        9>&- 8>&- </dev/null >/dev/null 2>&1 &
}

# wait_up PORT LAUNCHER_PID: poll until AMQP answers; fail early if the node died.
wait_up() {
    local i
    for ((i = 0; i < START_TIMEOUT * 4; i++)); do
        amqp_ok "$1" && return 0
        if ! running "$2"; then
            log "broker process exited"
            return 1
        fi
        sleep 0.25
    done
    return 1
}

report() {
    echo "REBOUND_TEST_BROKER=amqp://guest:guest@127.0.0.1:$1/"
}

# One start/stop at a time per DIR (parallel test jobs may share it).
exec 9>"$DIR/.lock"
flock -w 180 9 || die "timed out waiting for the lock on $DIR"

case $cmd in
    start)
        # Nodes in other DIRs choose ports too: one start at a time on the
        # machine, so two of them never pick the same free port.
        exec 8>/tmp/rebound-broker-start.lock
        flock -w 300 8 || die "timed out waiting for the machine-wide start lock"
        do_start ;;
    stop) do_stop ;;
    *) usage ;;
esac
