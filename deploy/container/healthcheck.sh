#!/bin/bash
# The container image's HEALTHCHECK: GET /healthz on the admin endpoint of
# the rebound running in this container, without curl (bash's /dev/tcp).
#
#   healthcheck [HOST:PORT]
#
# Without an address, the one the running rebound uses: its own flags (from
# /proc) and this environment, read by `rebound --check` (the settings as a
# start would read them: flags, REBOUND_* variables, the config file). A
# wildcard address is asked on loopback. With `--admin off` there is nothing
# to ask: healthy while rebound runs.
set -uo pipefail

bin=/usr/local/bin/rebound
fail() { echo "unhealthy: $*"; exit 1; }

# The rebound process whose parent is no rebound: the one started, not
# one of the workers it runs with --workers.
rebound_pid() {
  local d ppid
  for d in /proc/[0-9]*; do
    [ "$(readlink "$d/exe" 2>/dev/null)" = "$bin" ] || continue
    ppid=$(awk '/^PPid:/ { print $2 }' "$d/status" 2>/dev/null) || continue
    [ "$(readlink "/proc/$ppid/exe" 2>/dev/null)" = "$bin" ] && continue
    echo "${d#/proc/}"
    return 0
  done
  return 1
}

addr=${1:-}
if [ -z "$addr" ]; then
  pid=$(rebound_pid) || fail "no rebound process"
  mapfile -d '' args <"/proc/$pid/cmdline" || fail "cannot read /proc/$pid/cmdline"
  check=$("$bin" --check "${args[@]:1}" 2>&1) || fail "rebound --check: ${check##*$'\n'}"
  addr=$(printf '%s\n' "$check" | awk '$1 == "--admin" { print $2; exit }')
  [ -n "$addr" ] || fail "no --admin line from rebound --check"
  [ "$addr" = off ] && { echo "healthy: admin endpoint off, rebound runs (pid $pid)"; exit 0; }
fi

port=${addr##*:}
host=${addr%:*}
host=${host#[}
host=${host%]}
case $host in
  ''|0.0.0.0|'*') host=127.0.0.1 ;;
  ::) host=::1 ;;
esac

{ exec 3<>"/dev/tcp/$host/$port"; } 2>/dev/null || fail "cannot connect to $host:$port"
printf 'GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n' >&3
IFS=' ' read -r -t 5 proto code _ <&3 || fail "no answer from $host:$port/healthz"
[ "$code" = 200 ] || fail "$host:$port/healthz answered ${proto:-nothing} ${code:-}"
echo "healthy: $host:$port/healthz 200"
