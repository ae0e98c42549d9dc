#!/usr/bin/env bash
# Integration: Debian's amqp-tools (rabbitmq-c command-line clients)
# through rebound, run by with_rebound.sh.
set -euo pipefail
url=amqp://guest:guest@$REBOUND_PROXY_HOST:$REBOUND_PROXY_PORT/%2F
q=amqp-tools.$$.$RANDOM
amqp-declare-queue -u "$url" -q "$q" >/dev/null
for i in 1 2 3; do
  amqp-publish -u "$url" -r "$q" -p -C text/plain -H "x-n: $i" -b "body $i"
done
got=$(amqp-get -u "$url" -q "$q")
[ "$got" = "body 1" ] || { echo "amqp-get: '$got'"; exit 1; }
# consume the remaining two, acking each
out=$(amqp-consume -u "$url" -q "$q" -c 2 cat)
[ "$out" = "body 2body 3" ] || { echo "amqp-consume: '$out'"; exit 1; }
if amqp-get -u "$url" -q "$q" >/dev/null 2>&1; then
  echo "queue should be empty"; exit 1
fi
amqp-delete-queue -u "$url" -q "$q" >/dev/null
echo "amqp-tools: 1 passed, 0 failed"
