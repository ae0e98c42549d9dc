#!/usr/bin/env bash
# Re-record the golden AMQP 0-9-1 captures used by the codec tests.
#
#   tests/amqp_codec/golden/record.sh [SESSION...]     default: pika kombu bunny tools
#
# For each session: start scripts/capture_relay.py in front of a private broker
# (scripts/broker.sh, state in $REBOUND_BROKER_DIR, default build/broker), run the
# session's driver through it, and write SESSION.client.hex / SESSION.server.hex and
# SESSION.frames.txt (decode.py listing) here. A broker this script started is
# stopped at the end; one that was already running is left alone.
# After re-recording, check MANIFEST.md against the new SESSION.frames.txt.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
broker_dir=${REBOUND_BROKER_DIR:-$root/build/broker}
py=$(command -v python3)   # for relay and decode (stdlib only)
debian_py=/usr/bin/python3 # pika and kombu are Debian packages: not in pyenv & co.

sessions=("$@")
[ ${#sessions[@]} -gt 0 ] || sessions=(pika kombu bunny tools)

driver() {  # driver SESSION -> command (broker URL and relay port are appended)
    case $1 in
        pika) echo "$debian_py $here/session_pika.py" ;;
        kombu) echo "$debian_py $here/session_kombu.py" ;;
        bunny) echo "ruby $here/session_bunny.rb" ;;
        tools) echo "bash $here/session_tools.sh" ;;
        *) echo "record.sh: unknown session $1" >&2; return 1 ;;
    esac
}
for s in "${sessions[@]}"; do driver "$s" >/dev/null; done

# Broker: reuse a running one, else start one and stop it when done.
was_running=no
if [ -s "$broker_dir/launcher.pid" ] && kill -0 "$(cat "$broker_dir/launcher.pid")" 2>/dev/null; then
    was_running=yes
fi
url=$("$root/scripts/broker.sh" start "$broker_dir" | tail -n 1)
url=${url#REBOUND_TEST_BROKER=}
hostport=${url#amqp://*@}
hostport=${hostport%/}

work=$(mktemp -d)
relay_pid=
cleanup() {
    [ -n "$relay_pid" ] && kill "$relay_pid" 2>/dev/null || true
    rm -rf "$work"
    if [ "$was_running" = no ]; then "$root/scripts/broker.sh" stop "$broker_dir" || true; fi
}
trap cleanup EXIT

record() {
    local s=$1 port i
    echo "record.sh: recording $s" >&2
    "$py" "$root/scripts/capture_relay.py" --listen 0 --upstream "$hostport" \
        --out "$work/$s" --accept-timeout 60 >"$work/$s.relay" 2>"$work/$s.relay.err" &
    relay_pid=$!
    for ((i = 0; i < 100; i++)); do
        grep -q '^LISTENING' "$work/$s.relay" 2>/dev/null && break
        sleep 0.1
    done
    port=$(awk '/^LISTENING/ {print $2}' "$work/$s.relay")
    [ -n "$port" ] || { echo "record.sh: relay did not start" >&2; return 1; }
    # shellcheck disable=SC2046
    $(driver "$s") "$url" "$port"
    wait "$relay_pid"
    relay_pid=
    cat "$work/$s.relay.err" >&2
    # Only replace the fixtures once the capture decodes cleanly.
    "$py" "$here/decode.py" "$work/$s.client.hex" "$work/$s.server.hex" \
        | sed "s|$work/||" >"$work/$s.frames.txt"
    if grep -q -e 'trailing' -e 'unparsed' "$work/$s.frames.txt"; then
        echo "record.sh: $s capture does not decode cleanly" >&2
        return 1
    fi
    mv "$work/$s.client.hex" "$work/$s.server.hex" "$work/$s.frames.txt" "$here/"
}

for s in "${sessions[@]}"; do record "$s"; done
echo "record.sh: done: ${sessions[*]}" >&2
