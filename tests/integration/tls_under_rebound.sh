#!/usr/bin/env bash
# tls_under_rebound.sh REBOUND_BIN: rebound with TLS on both sides (its
# listener, and the test broker's TLS listener upstream) in front of
# tls_pika_client.py, through with_rebound.sh (REBOUND_WRAPPER applies).
# The broker's TLS port and certificates come from its env file
# (scripts/broker.sh, REBOUND_TEST_BROKER_DIR).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
[ -n "${REBOUND_TEST_BROKER_DIR:-}" ] || { echo "no REBOUND_TEST_BROKER_DIR: skipped"; exit 77; }
. "$REBOUND_TEST_BROKER_DIR/env"
port=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
c=$REBOUND_TEST_CERTS
export REBOUND_TLS_PORT=$port REBOUND_TEST_CERTS=$c
export REBOUND_ARGS="--tls-listen 127.0.0.1:$port --tls-cert $c/server.pem --tls-key $c/server.key --upstream amqps://localhost:$REBOUND_TEST_BROKER_TLS_PORT --upstream-ca $c/ca.pem --retry-tiers 200ms --max-attempts 3"
exec "$here/with_rebound.sh" "$1" /usr/bin/python3 "$here/tls_pika_client.py"
