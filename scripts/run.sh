#!/usr/bin/env bash
# Quick start: install what is missing, build rebound (release), and run it.
# Without --upstream/-u (or REBOUND_UPSTREAM), a private RabbitMQ is started
# on 127.0.0.1 (port 5672 if free), rebound is put in front of it, and the
# broker is stopped when rebound stops. --help, --version and --check start
# no broker.
#
#   scripts/run.sh [rebound options...]
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh --run
build=${REBOUND_BUILD_DIR:-build/release}
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DREBOUND_TESTS=OFF \
  -DREBOUND_BENCH=OFF >/dev/null
cmake --build "$build" -j "$(nproc)" --target rebound

upstream=${REBOUND_UPSTREAM:-}
for a in "$@"; do
  case $a in
  -h | --help | -V | --version | --check) exec "$build/rebound" "$@" ;;
  --upstream | --upstream=* | -u | -u?*) upstream=given ;;
  esac
done
[ -n "$upstream" ] && exec "$build/rebound" "$@"

# No upstream given: a private RabbitMQ, stopped again when rebound stops
# (Ctrl-C or SIGTERM reach rebound, which drains; then the broker goes).
broker_dir=$build/broker
url=$(REBOUND_BROKER_OWNER=$$ scripts/broker.sh start "$broker_dir" | tail -n 1)
port=${url##*:}
port=${port%/}
echo "run: RabbitMQ on 127.0.0.1:$port, stopped when rebound stops"
"$build/rebound" --upstream "127.0.0.1:$port" "$@" &
pid=$!
trap 'kill -TERM "$pid" 2>/dev/null || true' INT TERM
rc=0
while kill -0 "$pid" 2>/dev/null; do
  wait "$pid" && rc=0 || rc=$?
done
echo "run: rebound exited ($rc); stopping RabbitMQ"
scripts/broker.sh stop "$broker_dir" >/dev/null
exit "$rc"
