#!/usr/bin/env bash
# Quick start: install what is missing, build rebound (release), and run it.
# Without --upstream (or REBOUND_UPSTREAM), a private RabbitMQ is started on
# 127.0.0.1 (port 5672 if free) and rebound is put in front of it.
#
#   scripts/run.sh [rebound options...]
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh --run
build=${REBOUND_BUILD_DIR:-build/release}
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DREBOUND_TESTS=OFF \
  -DREBOUND_BENCH=OFF >/dev/null
cmake --build "$build" -j "$(nproc)" --target rebound

args=("$@")
upstream=${REBOUND_UPSTREAM:-}
for a in "$@"; do
  case $a in --upstream | --upstream=*) upstream=given ;; esac
done
if [ -z "$upstream" ]; then
  broker_dir=$build/broker
  url=$(scripts/broker.sh start "$broker_dir" | tail -n 1)
  port=${url##*:}
  port=${port%/}
  echo "run: RabbitMQ on 127.0.0.1:$port (stop: scripts/broker.sh stop $broker_dir)"
  args=(--upstream "127.0.0.1:$port" "${args[@]}")
fi
exec "$build/rebound" "${args[@]}"
