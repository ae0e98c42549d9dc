#!/usr/bin/env bash
# dlq_tools.sh REBOUND_BIN: dlq_tools.py through with_rebound.sh, rebound
# with its admin endpoint on a free port; REBOUND_WRAPPER (valgrind in
# scripts/test.sh) runs both rebound and `rebound dlq`.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
[ -n "${REBOUND_TEST_BROKER_DIR:-}" ] || { echo "no REBOUND_TEST_BROKER_DIR: skipped"; exit 77; }
. "$REBOUND_TEST_BROKER_DIR/env"
port=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
export REBOUND_DLQ_BIN=$1 REBOUND_DLQ_ADMIN=127.0.0.1:$port
export REBOUND_ARGS="--admin 127.0.0.1:$port ${REBOUND_ARGS:-}"
exec "$here/with_rebound.sh" "$1" /usr/bin/python3 "$here/dlq_tools.py"
