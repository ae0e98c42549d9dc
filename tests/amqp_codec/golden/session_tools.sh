#!/usr/bin/env bash
# Golden session "tools" (amqp-tools 0.11 = librabbitmq, the C client).
#
#   session_tools.sh BROKER_URL RELAY_PORT
#
# Setup (not recorded): declare golden.tools.q and publish two messages with
# amqp-publish. Recorded: one amqp-consume connection that consumes both with a
# SERVER-generated consumer tag, prefetch 1, then exits. Teardown (not recorded):
# delete the queue. Values are documented in MANIFEST.md; change both together.
set -euo pipefail

# librabbitmq reads a trailing "/" as vhost "" (NOT_ALLOWED): name "/" explicitly.
broker="${1%/}/%2F"
relay="amqp://guest:guest@127.0.0.1:$2/%2F"
q=golden.tools.q

amqp-delete-queue -u "$broker" -q "$q" >/dev/null 2>&1 || true
amqp-declare-queue -u "$broker" -q "$q" -d >/dev/null
amqp-publish -u "$broker" -r "$q" -p -C text/plain -H "x-tools: one" -b "tools one"
amqp-publish -u "$broker" -r "$q" -p -C text/plain -H "x-tools: two" -b "tools two"

# The recorded connection. `cat` gets each body on stdin.
out=$(amqp-consume -u "$relay" -q "$q" -c 2 -p 1 cat)
[ "$out" = "tools onetools two" ] || { echo "unexpected bodies: $out" >&2; exit 1; }

amqp-delete-queue -u "$broker" -q "$q" >/dev/null
