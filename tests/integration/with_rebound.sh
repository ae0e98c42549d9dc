#!/usr/bin/env bash
# with_rebound.sh REBOUND_BIN CMD [ARGS...]
# Start rebound on a free loopback port in front of $REBOUND_TEST_BROKER,
# run CMD with REBOUND_PROXY_HOST/REBOUND_PROXY_PORT (and REBOUND_PROXY_URL)
# set, then stop rebound with SIGTERM. Fails if CMD fails, if rebound does
# not exit 0, or if its log shows a sanitizer report. Exit 77 (skip) without
# a broker. REBOUND_WRAPPER, if set, runs rebound under a command (e.g.
# "valgrind --leak-check=full --error-exitcode=9"); REBOUND_ARGS adds
# options (word-split).
set -euo pipefail
bin=$1
shift
[ -n "${REBOUND_TEST_BROKER:-}" ] || { echo "REBOUND_TEST_BROKER not set: skipped"; exit 77; }
hostport=${REBOUND_TEST_BROKER#amqp://*@}
hostport=${hostport%/}
port=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
log=$(mktemp)
${REBOUND_WRAPPER:-} "$bin" --listen "127.0.0.1:$port" --upstream "$hostport" --log-level debug --admin off \
  ${REBOUND_ARGS:-} 2>"$log" &
pid=$!
cleanup() { kill -KILL "$pid" 2>/dev/null || true; rm -f "$log"; }
trap cleanup EXIT
for _ in $(seq 400); do
  grep -q 'msg=listening' "$log" && break
  kill -0 "$pid" 2>/dev/null || { cat "$log"; echo "rebound exited early"; exit 1; }
  sleep 0.05
done
export REBOUND_PROXY_HOST=127.0.0.1 REBOUND_PROXY_PORT=$port REBOUND_PID=$pid
export REBOUND_PROXY_URL="amqp://guest:guest@127.0.0.1:$port/%2F"
status=0
"$@" || status=$?
kill -TERM "$pid"
rc=0
wait "$pid" || rc=$?
if [ "$rc" -ne 0 ] || grep -Eq 'AddressSanitizer|LeakSanitizer|runtime error' "$log"; then
  echo "rebound exited $rc; its log:"
  cat "$log"
  status=1
fi
[ "$status" -eq 0 ] || { echo "--- rebound log (tail)"; tail -n 30 "$log"; }
exit "$status"
