#!/bin/sh
# The rebound executable answers --help and --version, lists every option
# with its environment variable and default, and refuses unknown options and
# bad values with exit status 2 and a message saying what is expected.
set -eu
bin=$1
"$bin" --version | grep -Eq '^rebound [0-9]+\.[0-9]+\.[0-9]+ \(libuv '
"$bin" --help | grep -q -- '--version'
"$bin" -h | grep -q '^Usage: rebound'
for flag in max-connections retry-confirm-timeout; do
  "$bin" --help | grep -q -- "--$flag " || { echo "--help lacks --$flag"; exit 1; }
done
"$bin" --help | grep -q 'env REBOUND_MAX_CONNECTIONS, default auto'
"$bin" --help | grep -q 'env REBOUND_RETRY_CONFIRM_TIMEOUT, default 30s'
set +e
"$bin" --no-such-option 2>/dev/null
rc=$?
set -e
[ "$rc" -eq 2 ] || { echo "unknown option exited $rc, want 2"; exit 1; }
set +e
msg=$("$bin" --max-connections 0 2>&1 >/dev/null)
rc=$?
set -e
[ "$rc" -eq 2 ] || { echo "--max-connections 0 exited $rc, want 2"; exit 1; }
echo "$msg" | grep -q "invalid value '0' (expected auto or a whole number" ||
  { echo "unclear error: $msg"; exit 1; }
# --help works whatever else is wrong
REBOUND_LISTEN=nope "$bin" --help | grep -q '^Usage: rebound' ||
  { echo "--help failed with a bad REBOUND_LISTEN"; exit 1; }

# --check: the effective settings and where each came from, exit 0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
printf 'listen: 127.0.0.1:6001\nretry:\n  policies:\n    - queues: [orders]\n      tiers: [1m30s]\n' >"$tmp/r.yaml"
out=$(REBOUND_CACHE_TOTAL=1G "$bin" --check -c "$tmp/r.yaml" --drain-timeout 0 \
  -u amqp://127.0.0.1) || { echo "--check exited $?"; exit 1; }
for want in "# rebound .*: the configuration is valid (config file: $tmp/r.yaml)" \
  '^--listen  *127.0.0.1:6001  *# file$' \
  '^--drain-timeout  *0  *# flag$' \
  '^--cache-total  *1G  *# environment REBOUND_CACHE_TOTAL$' \
  '^--upstream  *amqp://127.0.0.1  *# flag$' \
  '^--handshake-timeout  *10s  *# default$' \
  '"queues":\["orders"\],"tiers":\["90s"\]'; do
  echo "$out" | grep -q -- "$want" || { echo "--check lacks /$want/: $out"; exit 1; }
done
# a retry flag over a file of two policies says it replaced them
printf 'retry:\n  policies:\n    - queues: [a]\n    - queues: [b]\n' >"$tmp/two.yaml"
"$bin" --check -c "$tmp/two.yaml" --max-attempts 7 |
  grep -q "the retry flags replaced the file's 2 policies with one" ||
  { echo "--check did not say the flags replaced two policies"; exit 1; }
# ... and 2, binding nothing, when a certificate or a host name fails
set +e
out=$("$bin" --check --tls-listen 127.0.0.1:6002 --tls-cert "$tmp/none.pem" \
  --tls-key "$tmp/none.key" 2>&1)
rc=$?
set -e
[ "$rc" -eq 2 ] || { echo "--check with a missing certificate exited $rc"; exit 1; }
echo "$out" | grep -q "msg=tls_listener_config_failed" ||
  { echo "--check did not say why: $out"; exit 1; }
set +e
out=$("$bin" --check -l nosuchhost.invalid:6003 2>&1)
rc=$?
set -e
[ "$rc" -eq 2 ] || { echo "--check with an unknown host exited $rc"; exit 1; }
echo "$out" | grep -q "msg=check_address_failed option=listen" ||
  { echo "--check did not name the address: $out"; exit 1; }
echo "test_cli: ok"
